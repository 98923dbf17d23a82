"""The user commands: installed as console entry points and runnable with python -m, each
with a --help that says what it does and shows an example."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
COMMANDS = {
    "sret-prepare": "fairseq_sret_cli.prepare",
    "sret-evaluate": "fairseq_sret_cli.evaluate",
    "sret-average-checkpoints": "fairseq_sret_cli.average_checkpoints",
    "sret-plot-lrc": "fairseq_sret_cli.plot_lrc",
    "sret-train-vision": "fairseq_sret_cli.train_vision",
    "sret-train-cifar": "fairseq_sret_cli.train_cifar",
    "sret-count": "fairseq_sret_cli.count",
    "sret-toy-data": "fairseq_sret_cli.toy",
    "sret-uptrain": "fairseq_sret_cli.uptrain",
    "sret-experiments": "fairseq_sret_cli.experiments",
    "sret-export-hf": "fairseq_sret_cli.export_hf",
    "sret-export-ct2": "fairseq_sret_cli.export_ct2",
}
REPO = Path(__file__).resolve().parents[2]


def test_setup_py_installs_every_command():
    setup = (REPO / "setup.py").read_text()
    declared = dict(re.findall(r'"(sret-[\w-]+) = ([\w.]+):main"', setup))
    assert declared == COMMANDS


@pytest.mark.parametrize("command,module", COMMANDS.items())
def test_command_and_module_print_help_with_an_example(command, module):
    as_module = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True)
    assert as_module.returncode == 0, as_module.stderr
    assert re.search(rf"\n +{command} \S", as_module.stdout), as_module.stdout
    assert (BIN / command).exists(), (
        f"{command} is declared in setup.py but not installed in this environment: pip install -e . installs it")
    installed = subprocess.run([str(BIN / command), "--help"], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    assert re.search(rf"\n +{command} \S", installed.stdout), installed.stdout  # an indented example line
    assert installed.stdout.splitlines()[0].startswith(f"usage: {command}")


def test_count_vision_prints_the_official_sret_t_numbers():
    out = subprocess.run([str(BIN / "sret-count"), "vision", "sret_t"], capture_output=True, text=True, check=True).stdout
    assert "4,755,979" in out and "1.112" in out


@pytest.mark.reliability("one-line-errors")
def test_bad_arguments_fail_with_usage():
    result = subprocess.run([str(BIN / "sret-prepare"), "cifar10"], capture_output=True, text=True)
    assert result.returncode == 2 and "invalid choice: 'cifar10'" in result.stderr


def test_an_error_holding_a_traceback_is_its_own_last_line():
    """A worker process's or a subprocess's error arrives with its traceback in the message:
    the command prints what went wrong, not the frames."""
    from fairseq_sret_cli import error_message

    remote = "fairseq-preprocess failed:\nTraceback (most recent call last):\n  File \"binarizer.py\", line 9\n" \
             "    raise ValueError(line)\nValueError: train.de line 3: not UTF-8"
    assert error_message(RuntimeError(remote)) == "fairseq-preprocess failed: ValueError: train.de line 3: not UTF-8"
    assert error_message(ValueError("one\n  two")) == "one two"
