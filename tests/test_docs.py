"""The README is a guide and the docs hold together: its length and what comes first, every
relative link and anchor of the README and docs/ resolves, and neither names a folder of the
machine it was written on."""

import re
from pathlib import Path

import pytest

from conftest import REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "examples").rglob("README.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor_of(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lowercased, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {anchor_of(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def broken_links(page: Path) -> list:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path) if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_folder_of_a_development_machine(page):
    text = page.read_text(encoding="utf-8")
    assert not re.findall(r"/work/|\.\./shared/|/root/|/tmp/\w", text)


def test_the_readme_is_a_guide_that_starts_with_what_users_run():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
    first = lambda pattern: next(i for i, line in enumerate(lines, 1) if re.search(pattern, line))  # noqa: E731
    assert first(r"^fairseq-train ") <= 100
    assert first(r"^```python") <= 100
    set_up = [line for line in lines if re.match(r"bash scripts/\w+\.sh", line)]
    assert [line.split()[1] for line in set_up] == ["scripts/quickstart.sh", "scripts/run_tests.sh"]
    assert "scripts/run_tests.sh" in (REPO / ".ci" / "run").read_text()


def test_the_checker_finds_a_broken_link_and_a_missing_heading(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## Trained to convergence\n")
    page.write_text("[a](other.md#trained-to-convergence) [b](missing.md) [c](other.md#nope) [d](https://x.org)\n")
    assert broken_links(page) == ["missing.md (no such file)", "other.md#nope (no such heading)"]
