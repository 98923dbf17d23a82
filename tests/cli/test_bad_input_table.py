"""Bad input to our commands (the cases of ``bad_input_cases.py``, also the table of
docs/reliability.md): one clear line and a non-zero exit, nothing written or overwritten.

The ``sret-*`` cases run in this process (their ``main``); the fairseq-side ones (depth and
shape overrides, a foreign dictionary, a misspelt YAML field) run the installed commands on a
tiny trained model (e2e).
"""

import re
import shutil

import pytest

from bad_input_cases import CASES, error_line, make_model_folder, run_case, run_case_here
from conftest import HAVE_FAIRSEQ

IN_PROCESS = [c for c in CASES if not c.needs_model]
WITH_MODEL = [c for c in CASES if c.needs_model]


def check(case, rc, stderr, changed):
    assert rc not in (0, None), stderr[-2000:]
    line = error_line(case, stderr)
    assert case.message in line, stderr[-2000:]
    if case.style == "sret":
        # PROG: error: ..., or PROG SUBCOMMAND: error: ... (argparse's usage errors)
        assert "Traceback" not in stderr and re.match(rf"{re.escape(case.command)}( \w+)?: error: ", line), stderr[-2000:]
    unexpected = [c for c in changed if not any(c[1:] == k or c[1:].startswith(k + "/") for k in case.kept)]
    assert not unexpected, unexpected


@pytest.mark.parametrize("case", IN_PROCESS, ids=[c.id for c in IN_PROCESS])
@pytest.mark.reliability("one-line-errors")
def test_sret_commands_fail_in_one_line_and_write_nothing(case, tmp_path):
    if case.needs_fairseq and not HAVE_FAIRSEQ:
        pytest.skip(f"{case.command} needs fairseq (pip install -e '.[fairseq]')")
    case.setup(tmp_path)
    check(case, *run_case_here(case, tmp_path))


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    make_model_folder(folder)
    return folder


@pytest.mark.e2e
@pytest.mark.parametrize("case", WITH_MODEL, ids=[c.id for c in WITH_MODEL])
@pytest.mark.reliability("one-line-errors")
def test_fairseq_side_errors_name_the_problem(case, model_folder, tmp_path):
    folder = tmp_path / "case"
    shutil.copytree(model_folder, folder)
    case.setup(folder)
    check(case, *run_case(case, folder))


@pytest.mark.e2e
@pytest.mark.reliability("one-line-errors")
def test_the_installed_command_prints_one_line(tmp_path):
    case = next(c for c in CASES if c.id == "uptrain-output-is-input")
    case.setup(tmp_path)
    rc, stderr, changed = run_case(case, tmp_path)
    check(case, rc, stderr, changed)
