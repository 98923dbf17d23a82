"""The runner goes on past one run's evaluation failure: that run is recorded as failed with
its error (never left 'training'), the other runs train and are evaluated, and a 'lastN'
with no checkpoint to average is skipped and recorded instead of failing the run."""

import sys

import pytest

from fairseq_sret_cli.experiment_runner import parse_experiment, runner
from fairseq_sret_cli.experiment_runner.run_evaluation import NothingToAverage, checkpoint_for
from fairseq_sret_cli.experiment_runner.run_folder import RunPaths
from fairseq_sret_cli.experiment_runner.settings import collect_records


@pytest.fixture
def quick_runner(monkeypatch, tmp_path):
    """The runner with a training that exits at once and an evaluation that fails for row 'a'."""
    def train_command(experiment, run, data, paths, **_):
        paths.checkpoints.mkdir(parents=True, exist_ok=True)
        return [sys.executable, "-c", "pass"]

    def evaluate_run(experiment, paths, data, cpu=False, row=None, skipped=None, train=None):
        if row.id == "a":
            raise RuntimeError("fairseq-generate failed (exit 1)")
        try:
            checkpoint_for("last2", paths)
        except NothingToAverage as exc:
            skipped["last2"] = str(exc)
        return {"best": {"test": {"scores": []}}}

    monkeypatch.setattr(runner, "train_command", train_command)
    monkeypatch.setattr(runner, "evaluate_run", evaluate_run)
    monkeypatch.setattr(runner, "model_facts", lambda checkpoint: {"params": 1})
    (tmp_path / "data").mkdir()  # the data-bin: its contents are fingerprinted, never read here
    return tmp_path


def test_one_failed_evaluation_stops_no_other_run(quick_runner):
    experiment = parse_experiment({"name": "x", "train": {"max_update": 5}, "eval": {"checkpoints": ["best", "last2"]},
                                   "rows": [{"id": "a", "arch": "t"}, {"id": "b", "arch": "t"}]})
    with pytest.raises(RuntimeError, match="1 runs failed: a/seed1"):
        runner.run_experiment(experiment, str(quick_runner / "data"), quick_runner / "runs", progress_interval=0)
    records = {r.row: r for r in collect_records(experiment, quick_runner / "runs")}
    assert records["a"].status == "failed" and "fairseq-generate failed" in records["a"].error
    assert records["b"].done and "no epoch checkpoints" in records["b"].eval_skipped["last2"]


def test_nothing_to_average_is_its_own_error(tmp_path):
    paths = RunPaths(tmp_path)
    paths.checkpoints.mkdir()
    with pytest.raises(NothingToAverage, match=r"no update checkpoints .*\(--save-interval-updates\)"):
        checkpoint_for("last3u", paths)
