"""Convergence by --patience read from the validation history: the epoch a run stops at,
a run trained past it (resumed by a fairseq that lost the count) counted and evaluated as of
that epoch, and the runner training no further a run whose log already meets it."""

import json
import sys

import pytest

from fairseq_sret_cli.experiment_runner import parse_experiment, runner, training_summary
from fairseq_sret_cli.experiment_runner.records import TranslationRunRecord
from fairseq_sret_cli.experiment_runner.run_evaluation import checkpoint_for
from fairseq_sret_cli.experiment_runner.run_folder import RunPaths, read_record, run_paths, write_record
from fairseq_sret_cli.experiment_runner.settings import finished_record, run_settings
from fairseq_sret_cli.experiment_runner.training import refresh_training, summarise_training
from fairseq_sret_cli.experiment_runner.training_log import parse_training_log, stopping_epoch

VALID = [4.0, 3.0, 2.5, 2.6, 2.5, 2.45, 2.4, 2.8, 2.9, 3.0, 2.95, 3.1]  # best 2.4 at epoch 7


def log_text(losses, updates_per_epoch=10, restart_after=None):
    """A fairseq JSON log with one validation per epoch; ``restart_after``: a second process
    resumes from that epoch's checkpoint."""
    lines = ["x | INFO | fairseq.trainer | No existing checkpoint found c/checkpoint_last.pt"]
    for epoch, loss in enumerate(losses, start=1):
        update = epoch * updates_per_epoch
        lines.append(f'x | INFO | valid | {{"epoch": {epoch}, "valid_loss": "{loss}", "valid_num_updates": "{update}"}}')
        lines.append(f'x | INFO | train | {{"epoch": {epoch}, "train_wps": "1000", "train_num_updates": "{update}",'
                     f' "train_wall": "{epoch * 10}"}}')
        if epoch == restart_after:
            lines.append("x | INFO | fairseq.trainer | Loaded checkpoint c/checkpoint_last.pt"
                         f" (epoch {epoch} @ {update} updates)")
    return "\n".join(lines) + "\n"


def test_the_stopping_epoch_follows_fairseq_s_rule():
    curve = [{"epoch": e, "valid_loss": v} for e, v in enumerate(VALID, start=1)]
    assert stopping_epoch(curve, 3) == 10  # 2.4 at 7, then 3 without improvement
    assert stopping_epoch(curve, 2) == 5  # 2.5 at 3; 2.6 and an equal 2.5 do not improve
    assert stopping_epoch(curve, 6) is None and stopping_epoch(curve, 0) is None


def test_progress_says_how_far_a_run_is_from_its_patience(tmp_path):
    run = parse_experiment({"name": "x", "train": {"max_epoch": 60, "patience": 10},
                            "rows": [{"id": "a", "arch": "t"}]}).runs()[0]
    paths = run_paths(tmp_path, run)
    paths.root.mkdir(parents=True)
    paths.train_log.write_text(log_text(VALID[:9]))  # best 2.4 at epoch 7, then 2.8 and 2.9
    line = runner._progress_line(run, paths, started=0.0, patience=10)
    assert "valid loss 2.9 (best 2.4) 2 of --patience 10 without improvement" in line
    assert "without improvement" not in runner._progress_line(run, paths, started=0.0)


def test_a_run_trained_past_its_stopping_epoch_counts_to_it():
    summary = training_summary(parse_training_log(log_text(VALID)), patience=3)
    assert (summary["stopped_at_epoch"], summary["epochs_trained"], summary["epochs"]) == (10, 12, 10)
    assert (summary["best_epoch"], summary["updates"], summary["seconds"]) == (7, 100, 100)
    assert [p["epoch"] for p in summary["curve"]] == list(range(1, 11))
    stopped = training_summary(parse_training_log(log_text(VALID[:10])), patience=3)
    assert stopped["stopped_at_epoch"] == 10 and "epochs_trained" not in stopped
    assert "stopped_at_epoch" not in training_summary(parse_training_log(log_text(VALID)))


def test_a_cut_run_is_evaluated_as_of_its_stopping_epoch(tmp_path, monkeypatch):
    paths = RunPaths(tmp_path)
    paths.checkpoints.mkdir()
    for epoch in range(1, 13):
        (paths.checkpoints / f"checkpoint{epoch}.pt").write_text(str(epoch))
    averaged = []
    monkeypatch.setattr("fairseq_sret.checkpoints.average_checkpoints", lambda files: [p.name for p in files])
    monkeypatch.setattr("fairseq_sret.checkpoints.save_checkpoint",
                        lambda names, target: (averaged.append(names), target.write_text("avg")))
    train = {"best_epoch": 7, "stopped_at_epoch": 10, "epochs_trained": 12}
    assert checkpoint_for("best", paths, train).name == "checkpoint7.pt"
    assert checkpoint_for("last", paths, train).name == "checkpoint10.pt"
    assert checkpoint_for("last3", paths, train).name == "checkpoint.last3.to10.pt"
    assert averaged == [["checkpoint10.pt", "checkpoint9.pt", "checkpoint8.pt"]]
    assert checkpoint_for("last3", paths).name == "checkpoint.last3.pt"
    assert averaged[-1] == ["checkpoint12.pt", "checkpoint11.pt", "checkpoint10.pt"]
    assert checkpoint_for("best", paths, {"best_epoch": 7, "stopped_at_epoch": 10}).name == \
        "checkpoint_best.pt"  # stopped by fairseq itself: its own best


@pytest.fixture
def converging(monkeypatch, tmp_path):
    """The runner with a stand-in training: it writes the log it is given, then waits."""
    calls = {"evaluated": []}

    def train_command(experiment, run, data, paths, **_):
        paths.checkpoints.mkdir(parents=True, exist_ok=True)
        text = log_text(VALID)
        return [sys.executable, "-c", f"import sys, time\nsys.stdout.write({text!r})\nsys.stdout.flush()\n"
                                      "time.sleep(120)"]

    def evaluate_run(experiment, paths, data, cpu=False, row=None, skipped=None, train=None):
        calls["evaluated"].append(checkpoint_for("best", paths, train).name)
        return {"best": {"test": {"scores": []}}}

    monkeypatch.setattr(runner, "train_command", train_command)
    monkeypatch.setattr(runner, "evaluate_run", evaluate_run)
    monkeypatch.setattr(runner, "model_facts", lambda checkpoint: {"params": 1})
    monkeypatch.setattr(runner, "CONVERGENCE_CHECK_SECONDS", 0.0)
    (tmp_path / "data").mkdir()  # the data-bin: its contents are fingerprinted, never read here
    return calls


EXPERIMENT = {"name": "x", "train": {"max_epoch": 60, "patience": 3}, "eval": {"checkpoints": ["best"]},
              "rows": [{"id": "a", "arch": "t"}]}


def test_a_training_whose_log_meets_patience_is_stopped_and_counted_to_it(converging, tmp_path):
    experiment = parse_experiment(EXPERIMENT)
    records = runner.run_experiment(experiment, str(tmp_path / "data"), tmp_path / "runs", progress_interval=0)
    assert converging["evaluated"] == ["checkpoint7.pt"]
    assert records[0].done
    assert (records[0].train["stopped_at_epoch"], records[0].train["epochs_trained"]) == (10, 12)


def test_a_run_whose_log_already_meets_patience_is_not_trained_again(converging, tmp_path):
    experiment = parse_experiment(EXPERIMENT)
    run = experiment.runs()[0]
    paths = run_paths(tmp_path / "runs", run)
    paths.checkpoints.mkdir(parents=True)
    settings = run_settings(experiment, run, str(tmp_path / "data"), tmp_path / "runs", False, None, None, None)
    write_record(paths, TranslationRunRecord(status="training", train_settings=settings))
    before = log_text(VALID, restart_after=5)
    paths.train_log.write_text(before)
    samples = [{"pid": 1, "from_update": 0, "update": 60, "process_cpu_seconds": 60.0},
               {"pid": 2, "from_update": 50, "update": 100, "process_cpu_seconds": 45.0},
               {"pid": 2, "from_update": 50, "update": 120, "process_cpu_seconds": 65.0}]
    paths.cpu_trace.write_text("".join(json.dumps(s) + "\n" for s in samples))
    records = runner.run_experiment(experiment, str(tmp_path / "data"), tmp_path / "runs", progress_interval=0)
    assert paths.train_log.read_text() == before and converging["evaluated"] == ["checkpoint7.pt"]
    train = records[0].train
    assert (train["stopped_at_epoch"], train["updates"], train["starts"]) == (10, 100, 2)
    assert records[0].done and finished_record(experiment, run, tmp_path / "runs") is not None
    assert train["cpu_seconds"] == 60.0 + 45.0  # epoch 5's 50 updates from the first process, then the second's


def test_report_only_reads_a_finished_run_s_training_again(tmp_path):
    """A record summarised by older rules (no cut, CPU seconds of one process) is read again
    from its folder's log and trace; the decoded scores stay."""
    experiment = parse_experiment(dict(EXPERIMENT, eval={"checkpoints": ["best"], "curve": {"every": 5}}))
    run = experiment.runs()[0]
    paths = run_paths(tmp_path, run)
    paths.root.mkdir(parents=True)
    paths.train_log.write_text(log_text(VALID, restart_after=5))
    samples = [{"pid": 1, "from_update": 0, "update": 60, "process_cpu_seconds": 60.0},
               {"pid": 2, "from_update": 50, "update": 120, "process_cpu_seconds": 65.0}]
    paths.cpu_trace.write_text("".join(json.dumps(s) + "\n" for s in samples))
    old = {"status": "done", "train": {"epochs": 12, "updates": 120}, "eval": {"best": {"test": {"scores": [1]}}},
           "curve": [{"epoch": 10, "update": 100, "cpu_seconds": 999.0, "eval": {}}]}
    write_record(paths, TranslationRunRecord.from_json(old))
    assert refresh_training(experiment, tmp_path) == [run.name]
    record = read_record(paths)
    assert (record.train["epochs"], record.train["updates"], record.train["stopped_at_epoch"]) == (10, 100, 10)
    assert record.train["cpu_seconds"] == pytest.approx(60.0 + 50 / 70 * 65.0, abs=0.1)  # linear within process 2
    assert record.curve[0]["cpu_seconds"] == record.train["cpu_seconds"]
    assert record.eval == old["eval"]
    assert refresh_training(experiment, tmp_path) == []  # read once, nothing changes again


def test_a_trace_that_ends_before_the_last_update_counts_nothing_and_says_how_far_it_went(tmp_path):
    """The CPU time to the end is not guessed past the last sample; what the trace does measure
    is recorded and the report's table of restarted runs names it."""
    from fairseq_sret_cli.experiment_runner.report import restarted_runs

    paths = RunPaths(tmp_path)
    paths.train_log.write_text(log_text(VALID[:10], restart_after=5))
    samples = [{"pid": 1, "from_update": 0, "update": 50, "process_cpu_seconds": 50.0},
               {"pid": 1, "from_update": 0, "update": 60, "process_cpu_seconds": 60.0},
               {"pid": 2, "from_update": 50, "update": 90, "process_cpu_seconds": 40.0}]  # its last 10 updates unsampled
    paths.cpu_trace.write_text("".join(json.dumps(s) + "\n" for s in samples))
    experiment = parse_experiment(dict(EXPERIMENT, eval={"checkpoints": ["best"], "curve": {"every": 5}}))
    train = summarise_training(experiment, paths, TranslationRunRecord())
    assert train["updates"] == 100 and train["cpu_seconds"] is None
    assert train["cpu_traced_to"] == {"update": 90, "seconds": 90.0}
    run = TranslationRunRecord(row="r", seed=1, status="done", train=train, train_processes=2)
    table = "\n".join(restarted_runs([run]))
    assert "| r/seed1 | 2 | none: the CPU trace ends at update 90 of 100 (90 s) |" in table
