"""The pieces every experiment kind shares: the kind an experiment file names, the scheduler's
slots, deadline and interruption, and the typed image and translation run records."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fairseq_sret_cli.experiments import get_parser
from fairseq_sret_cli.experiment_runner.kinds import experiment_kind
from fairseq_sret_cli.experiment_runner.records import ImageRunRecord, TranslationRunRecord
from fairseq_sret_cli.experiment_runner.scheduler import ProcessScheduler

REPO = Path(__file__).resolve().parents[3]


class Sleeps(ProcessScheduler):
    """Each job a ``sleep SECONDS`` process; records how many ran at once and what was stopped."""

    poll_seconds = 0.02

    def __init__(self, seconds, jobs=1, deadline=None, interrupt_after=None, progress_interval=0.0):
        super().__init__(jobs, deadline, progress_interval)
        self.pending = list(seconds)
        self.most_at_once, self.ended, self.stopped, self.deadline_said = 0, [], [], False
        self.interrupt_after = interrupt_after

    def start_next(self):
        seconds = self.pending.pop(0)
        self.running.append((seconds, subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])))
        self.most_at_once = max(self.most_at_once, len(self.running))
        return True

    def watch(self):
        if self.interrupt_after is not None and len(self.ended) >= self.interrupt_after:
            raise KeyboardInterrupt

    def progress_lines(self):
        return [f"sleeping {seconds} s" for seconds, _ in self.running]

    def reap_ended(self):
        for job in list(self.running):
            if job[1].poll() is not None:
                self.running.remove(job)
                self.ended.append(job[0])

    def stop_running(self):
        for seconds, process in self.running:
            process.terminate()
            process.wait()
            self.stopped.append(seconds)
        self.running.clear()

    def at_deadline(self):
        self.deadline_said = True
        self.stop_running()


def test_the_scheduler_runs_at_most_jobs_at_once_and_every_job_to_its_end():
    scheduler = Sleeps([0.3, 0.3, 0.3, 0.3, 0.3], jobs=2)
    scheduler.schedule()
    assert scheduler.most_at_once == 2 and len(scheduler.ended) == 5 and not scheduler.stopped


def test_at_the_deadline_the_scheduler_stops_what_runs_and_starts_nothing_more():
    scheduler = Sleeps([30.0, 30.0, 30.0], jobs=1, deadline=time.time() + 1.0)
    started = time.time()
    scheduler.schedule()
    assert time.time() - started < 10
    assert scheduler.deadline_said and scheduler.stopped == [30.0] and scheduler.pending == [30.0, 30.0]


def test_an_interrupted_scheduler_stops_its_processes_and_raises():
    scheduler = Sleeps([0.0, 30.0, 30.0], jobs=2, interrupt_after=1)
    with pytest.raises(KeyboardInterrupt):
        scheduler.schedule()
    # the first job's slot went to the third before the interruption: both long ones are stopped
    assert scheduler.ended == [0.0] and scheduler.stopped == [30.0, 30.0] and not scheduler.running


@pytest.mark.parametrize("interval", [0.1, 0.0])
def test_the_scheduler_says_how_each_job_goes_every_progress_interval_and_never_with_0(interval, capsys):
    started = time.time()
    Sleeps([0.6, 0.6], jobs=2, progress_interval=interval).schedule()
    took = time.time() - started
    said = capsys.readouterr().err.splitlines()
    if interval:
        assert set(said) == {"[experiments] sleeping 0.6 s"} and len(said) % 2 == 0  # a line for each job
        assert 2 <= len(said) // 2 <= took / interval
    else:
        assert said == []


def _kind(*argv):
    return experiment_kind(get_parser().parse_args(list(argv)), "sret-experiments " + " ".join(argv))


def test_the_file_names_its_kind_and_each_kind_builds_its_training_command(tmp_path):
    vision = _kind(str(REPO / "examples/cifar10/ladder.yaml"), "--data", "data/cifar10", "--output", str(tmp_path))
    assert type(vision).__name__ == "ImageKind"
    command = vision.commands()[0]
    assert command[:3] == [sys.executable, "-m", "fairseq_sret_cli.train_cifar"]
    assert command[command.index("--output") + 1].startswith(str(tmp_path))
    translation = _kind(str(REPO / "examples/multi30k/cpu_experiments.yaml"), "--output", str(tmp_path),
                        "--report-only")
    assert type(translation).__name__ == "TranslationKind"
    assert translation.commands()[0][1:3] == ["-m", "fairseq_cli.train"]
    assert len(translation.commands()) == len(translation.experiment.runs())


@pytest.mark.parametrize("name", ["cifar10_ladder", "cifar10_cct"])
def test_the_committed_image_results_load_as_typed_records_and_write_back_the_same(name):
    stored = json.loads((REPO / "docs/results" / f"{name}.json").read_text(encoding="utf-8"))["runs"]
    records = [ImageRunRecord.from_json(run) for run in stored]
    assert [r.to_json() for r in records] == stored
    assert {r.status for r in records} <= {"done", "missing"}
    assert all(r.result is not None for r in records if r.done)


def test_a_recorded_run_that_does_not_serve_is_kept_as_recorded():
    recorded = {"row": "a", "seed": 1, "status": "done", "result": {"val": 1.0}, "history": [], "extra": 3}
    record = ImageRunRecord("a", 1, "missing", not_matching="other data", recorded=recorded)
    assert record.to_json() == dict(recorded, not_matching="other data") and not record.done


@pytest.mark.slow
@pytest.mark.parametrize("name", ["multi30k_cpu", "multi30k_converged", "multi30k_frontier_models"])
def test_a_committed_translation_report_written_again_from_its_records_is_the_same_file(name, tmp_path, monkeypatch):
    """Its recorded ``--report-only`` command, run in a copy of the repository's layout (no run
    folders: the finished runs are the JSON's) writes the committed files byte for byte."""
    import shlex

    from fairseq_sret_cli import experiments

    results = REPO / "docs/results"
    stored = json.loads((results / f"{name}.json").read_text(encoding="utf-8"))
    argv = shlex.split(stored["command"])
    assert argv[0] == "sret-experiments" and "--report-only" in argv
    experiment_file = Path(argv[1])
    (tmp_path / experiment_file).parent.mkdir(parents=True)
    (tmp_path / experiment_file).write_bytes((REPO / experiment_file).read_bytes())
    committed = {p.name: p.read_bytes() for p in results.glob(f"{name}*")
                 if p.stem == name or p.stem.startswith(f"{name}_") and p.suffix == ".png"}
    folder = tmp_path / (argv[argv.index("--results") + 1] if "--results" in argv else "docs/results")
    folder.mkdir(parents=True)
    for file_name, content in committed.items():
        (folder / file_name).write_bytes(content)
    monkeypatch.chdir(tmp_path)
    assert experiments.main(argv[1:]) == 0
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name in committed} == committed


@pytest.mark.parametrize("name", ["multi30k_cpu", "multi30k_converged", "multi30k_frontier_models",
                                  "quickstart_candidates"])
def test_the_committed_translation_results_load_as_typed_records_and_write_back_the_same(name):
    stored = json.loads((REPO / "docs/results" / f"{name}.json").read_text(encoding="utf-8"))
    records = [TranslationRunRecord.from_json(run) for run in stored["runs"] + stored["earlier_runs"]]
    assert [json.dumps(r.to_json()) for r in records] == [json.dumps(run) for run in
                                                          stored["runs"] + stored["earlier_runs"]]  # key order too
    assert records and all(r.done and r.name == f"{r.row}/seed{r.seed}" for r in records)
    assert all(r.eval and r.train is not None and r.config for r in records)


def test_a_translation_record_keeps_the_keys_it_does_not_name_and_adds_new_ones_after_those_read():
    stored = {"train_cpu_seconds": 5.0, "status": "training", "row": "a", "seed": 1, "continued_from": "x",
              "error": None}
    record = TranslationRunRecord.from_json(stored)
    assert record.extras == {"continued_from": "x", "error": None} and record.status == "training"
    record.update(status="done", train={"updates": 3}, model={"params": 1})
    assert list(record.to_json()) == [*stored, "train", "model"] and record.to_json()["status"] == "done"
    record.train_cpu_seconds = None  # dropped
    assert "train_cpu_seconds" not in record.to_json() and record.to_json()["continued_from"] == "x"
    with pytest.raises(TypeError, match="no field 'result'"):
        record.update(result={})
    # a run the runner starts: the keys in the order it first writes them
    fresh = TranslationRunRecord()
    fresh.update(status="training", row="b", seed=2, config={}, uptrain={"from": "a/seed2"})
    assert list(fresh.to_json()) == ["uptrain", "status", "row", "seed", "config"]
    assert TranslationRunRecord.from_json({}).to_json() == {} and not fresh.done
