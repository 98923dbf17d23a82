"""docs/reliability.md's classes of failure: each held by marked tests, the page as they print it."""

from pathlib import Path

import pytest

from failure_classes import BEGIN, CLASSES, END, marked_tests, section

REPO = Path(__file__).resolve().parents[1]


def test_every_class_is_held_by_tests_and_every_mark_names_a_class():
    marked = marked_tests()
    assert sorted(marked) == sorted(c.id for c in CLASSES)
    assert all(len(tests) >= 1 for tests in marked.values())


def test_the_page_lists_the_classes_as_the_tests_mark_them():
    page = (REPO / "docs" / "reliability.md").read_text(encoding="utf-8")
    assert page.count(BEGIN) == 1 and page.count(END) == 1, "regenerate: python tests/failure_classes.py"
    listed = page[page.index(BEGIN): page.index(END) + len(END)]
    assert listed == section(), "docs/reliability.md is out of date: python tests/failure_classes.py"


def test_the_scan_finds_a_marked_test_among_unmarked_ones(tmp_path):
    (tmp_path / "test_x.py").write_text('import pytest\n\n@pytest.mark.reliability("some-class")\n'
                                        '@pytest.mark.parametrize("v", [1])\ndef test_y(v):\n    pass\n\n\n'
                                        'def test_z():\n    pass\n')
    assert marked_tests(tmp_path) == {"some-class": [(str(tmp_path / "test_x.py"), "test_y")]}
