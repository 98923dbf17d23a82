"""SRET_TRACEBACK: a traceback only when it asks for one."""

import pytest

from fairseq_sret_cli import UserError, tracebacks_wanted, user_errors


@user_errors("sret-example")
def failing_main():
    raise UserError("the input is wrong")


@pytest.mark.parametrize("value", [None, "", "0", "no", "false", "OFF"])
@pytest.mark.reliability("inputs-as-they-seem")
def test_an_error_is_one_line_unless_asked(monkeypatch, capsys, value):
    if value is None:
        monkeypatch.delenv("SRET_TRACEBACK", raising=False)
    else:
        monkeypatch.setenv("SRET_TRACEBACK", value)
    assert failing_main() == 1
    assert capsys.readouterr().err == "sret-example: error: the input is wrong\n"


@pytest.mark.parametrize("value", ["1", "yes", "true"])
def test_sret_traceback_shows_the_traceback(monkeypatch, value):
    monkeypatch.setenv("SRET_TRACEBACK", value)
    with pytest.raises(UserError, match="the input is wrong"):
        failing_main()


STAGING_COMMAND = """
import os, shutil, sys, time
from pathlib import Path
from fairseq_sret_cli import user_errors

@user_errors("sret-example")
def main(out):
    staging = Path(out) / f".sret-example.{os.getpid()}"
    staging.mkdir(parents=True)
    try:
        (staging / "part.txt").write_text("half")
        print("staged", flush=True)
        time.sleep(60)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return 0

sys.exit(main(sys.argv[1]))
"""


@pytest.mark.reliability("interruption")
def test_sigterm_ends_a_command_as_ctrl_c_after_its_clean_up(tmp_path):
    """``kill`` (SIGTERM) once left the staging folders of sret-prepare and sret-evaluate
    behind: a command now cleans up, prints its one interrupted line and exits 143."""
    import signal
    import subprocess
    import sys

    from conftest import REPO

    process = subprocess.Popen([sys.executable, "-c", STAGING_COMMAND, str(tmp_path)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "staged"
    assert [p.name.split(".")[1] for p in tmp_path.iterdir()] == ["sret-example"]
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143
    assert stderr.strip().splitlines()[-1].startswith("sret-example: interrupted") and "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.reliability("inputs-as-they-seem")
@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("YES", True), ("on", True),
                                       ("0", False), ("false", False), ("off", False), ("", False), (None, False)])
def test_every_switch_reads_the_environment_alike(monkeypatch, value, on):
    from fairseq_sret.core import fused

    for name in ("SRET_TRACEBACK", "SRET_DISABLE_TRITON"):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # where Triton is installed, it could run here
    fused.triton_available.cache_clear()
    try:
        assert tracebacks_wanted() is on
        if on:  # the kernels are off whatever else the machine offers
            assert fused.triton_available() is False
    finally:
        fused.triton_available.cache_clear()
