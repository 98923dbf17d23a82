"""Which run trains first, and what a stopped runner leaves behind: interrupted runs resume
before new ones start (so begun rows finish first), and a runner stopped with SIGTERM
stops its trainings instead of leaving them running unwatched."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fairseq_sret_cli.experiment_runner import parse_experiment, runner
from fairseq_sret_cli.experiment_runner.records import TranslationRunRecord
from fairseq_sret_cli.experiment_runner.run_folder import run_paths, write_record
from fairseq_sret_cli.experiment_runner.settings import run_settings

EXPERIMENT = {"name": "x", "train": {"max_update": 5}, "eval": {"checkpoints": ["best"]},
              "rows": [{"id": "a", "arch": "t", "seeds": [1, 2]}, {"id": "b", "arch": "t", "seeds": [1, 2]}]}


def test_interrupted_runs_resume_before_new_runs_start(monkeypatch, tmp_path):
    order = tmp_path / "order"
    (tmp_path / "data").mkdir()  # the data-bin: its contents are fingerprinted, never read here

    def train_command(experiment, run, data, paths, **_):
        paths.checkpoints.mkdir(parents=True, exist_ok=True)
        return [sys.executable, "-c", f"open({str(order)!r}, 'a').write({run.name!r} + ' ')"]

    monkeypatch.setattr(runner, "train_command", train_command)
    monkeypatch.setattr(runner, "evaluate_run", lambda *a, **k: {"best": {"test": {"scores": []}}})
    monkeypatch.setattr(runner, "model_facts", lambda checkpoint: {"params": 1})
    experiment = parse_experiment(EXPERIMENT)
    for run in experiment.runs():
        if run.name in ("b/seed1", "a/seed2"):  # trained for a while by an earlier runner
            paths = run_paths(tmp_path / "runs", run)
            settings = run_settings(experiment, run, str(tmp_path / "data"), tmp_path / "runs", False, None, None, None)
            paths.checkpoints.mkdir(parents=True, exist_ok=True)  # train_command made it
            (paths.checkpoints / "checkpoint_last.pt").write_bytes(b"")
            write_record(paths, TranslationRunRecord(status="training", train_settings=settings))
    before = signal.getsignal(signal.SIGTERM)
    runner.run_experiment(experiment, str(tmp_path / "data"), tmp_path / "runs", progress_interval=0)
    assert order.read_text().split() == ["a/seed2", "b/seed1", "a/seed1", "b/seed2"]
    assert signal.getsignal(signal.SIGTERM) == before  # the runner's SIGTERM handler is its own while it runs


RUNNER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from fairseq_sret_cli.experiment_runner import parse_experiment, runner

    out = Path(sys.argv[1])
    def train_command(experiment, run, data, paths, **_):
        paths.checkpoints.mkdir(parents=True, exist_ok=True)
        code = "import os, time; open(%r, 'w').write(str(os.getpid())); time.sleep(120)" % str(out / "pid")
        return [sys.executable, "-c", code]
    runner.train_command = train_command
    experiment = parse_experiment({"name": "x", "train": {"max_update": 5}, "rows": [{"id": "a", "arch": "t"}]})
    (out / "data").mkdir()
    try:
        runner.run_experiment(experiment, str(out / "data"), out / "runs", progress_interval=0)
    except KeyboardInterrupt:
        sys.exit(130)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.reliability("interruption")
def test_a_runner_stopped_with_sigterm_stops_its_trainings(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path)], stderr=subprocess.PIPE, text=True)
    pid_file = tmp_path / "pid"
    deadline = time.time() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    training = int(pid_file.read_text())
    assert _alive(training)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr[-2000:]
    assert not _alive(training)
    record = json.loads((tmp_path / "runs" / "a" / "seed1" / "run.json").read_text())
    assert record["status"] == "training"  # resumable, not failed
