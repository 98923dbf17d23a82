"""The runner's learning curve: BLEU of every Nth epoch checkpoint against the training CPU
seconds it cost (``eval.curve``), the CPU-time trace it reads, and the epoch checkpoints it
keeps."""

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from fairseq_sret_cli.experiment_runner import parse_experiment, train_command
from fairseq_sret_cli.experiment_runner import report
from fairseq_sret_cli.experiment_runner.commands import portable
from fairseq_sret_cli.experiment_runner.cpu_time import CpuTrace, cpu_cost_path, cpu_seconds_at, read_cpu_trace
from fairseq_sret_cli.experiment_runner.records import TranslationRunRecord
from fairseq_sret_cli.experiment_runner.run_evaluation import evaluate_curve
from fairseq_sret_cli.experiment_runner.run_folder import RunPaths
from fairseq_sret_cli.experiment_runner.settings import run_config
from fairseq_sret_cli.experiment_runner.experiment_file import ExperimentError


def experiment(curve=None, checkpoints=("best", "last3")):
    raw = {"name": "t", "train": {"args": "--lr 1e-3", "max_epoch": 20, "patience": 3},
           "eval": {"subsets": ["test", "test1"], "checkpoints": list(checkpoints)},
           "rows": [{"id": "sret", "arch": "sret_transformer_tiny"}]}
    if curve is not None:
        raw["eval"]["curve"] = curve
    return parse_experiment(raw)


def test_the_curve_is_read_from_the_file_and_checked():
    ev = experiment({"every": 5}).evaluation
    assert (ev.curve_every, ev.curve_subsets) == (5, ["test"])  # the first subset by default
    assert experiment({"every": 2, "subsets": ["test1"]}).evaluation.curve_subsets == ["test1"]
    assert experiment().evaluation.curve_every == 0
    with pytest.raises(ExperimentError, match="eval.curve needs 'every'"):
        experiment({"subsets": ["test"]})
    with pytest.raises(ExperimentError, match="unknown fields \\['each'\\]"):
        experiment({"every": 5, "each": 1})
    with pytest.raises(ExperimentError, match="eval.curve.every must be an integer"):
        experiment({"every": "5"})


def test_with_a_curve_every_epoch_checkpoint_is_kept_until_read(tmp_path):
    paths = RunPaths(tmp_path)
    plain = train_command(experiment(), experiment().runs()[0], "bin", paths)
    assert plain[plain.index("--keep-last-epochs") + 1] == "3"
    curved = experiment({"every": 5})
    assert "--keep-last-epochs" not in train_command(curved, curved.runs()[0], "bin", paths)


def test_a_run_with_a_curve_is_another_configuration():
    run = experiment().runs()[0]
    assert run_config(experiment(), run) != run_config(experiment({"every": 5}), run)
    assert "curve" not in run_config(experiment(), run)["eval"]  # older results stay valid


def test_cpu_seconds_at_an_update_are_read_between_the_samples_around_it():
    samples = [{"update": 50, "cpu_seconds": 60.0}, {"update": 90, "cpu_seconds": 90.5},
               {"update": 140, "cpu_seconds": 121.0}]
    assert cpu_seconds_at(samples, 90) == 90.5
    assert cpu_seconds_at(samples, 115) == pytest.approx(105.75, abs=0.05)
    assert cpu_seconds_at(samples, 10) == 60.0
    assert cpu_seconds_at(samples, 141) is None


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads Linux's /proc")
def test_the_trace_samples_a_process_s_cpu_time_against_its_logged_update(tmp_path):
    paths = RunPaths(tmp_path)
    earlier = 'x | INFO | train_inner | {"epoch": 3, "num_updates": "500", "loss": "3"}\n'  # another process's
    paths.train_log.write_text(earlier)
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 0.6: pass\nprint('busy', flush=True)\ntime.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline().strip() == "busy"  # it has used at least 0.6 s of CPU
        trace = CpuTrace(paths, busy.pid, log_offset=len(earlier), interval=0.0)
        trace.poll(time.time())  # nothing logged by this process yet: nothing to pair the CPU time with
        assert not paths.cpu_trace.exists()
        with open(paths.train_log, "a") as log:
            log.write("x | INFO | fairseq.trainer | Loaded checkpoint c/checkpoint_last.pt (epoch 2 @ 40 updates)\n"
                      'x | INFO | train_inner | {"epoch": 2, "num_updates": "50", "loss": "3"}\n'
                      'x | INFO | valid | {"epoch": 2, "valid_loss": "2", "valid_num_updates": "7')
        trace.poll(time.time())
        with open(paths.train_log, "a") as log:  # the cut line ends; a later record follows
            log.write('0"}\nx | INFO | train | {"epoch": 2, "train_num_updates": "80"}\n')
        trace.poll(time.time())
    finally:
        busy.kill()
        busy.wait()
    samples = read_cpu_trace(paths)
    assert [(s["pid"], s["from_update"], s["update"]) for s in samples] == [(busy.pid, 40, 50), (busy.pid, 40, 80)]
    assert 0.5 <= samples[0]["process_cpu_seconds"] <= samples[1]["process_cpu_seconds"] < 30
    # the process logs its last updates and ends between two polls: the final sample has them,
    # with the CPU time its reaping measured
    with open(paths.train_log, "a") as log:
        log.write('x | INFO | valid | {"epoch": 3, "valid_loss": "2", "valid_num_updates": "95"}\n')
    trace.finish(31.0)
    last = read_cpu_trace(paths)[-1]
    assert (last["pid"], last["from_update"], last["update"], last["process_cpu_seconds"]) == (busy.pid, 40, 95, 31.0)


def sample(pid, from_update, update, seconds):
    return {"pid": pid, "from_update": from_update, "update": update, "process_cpu_seconds": seconds}


def test_a_resumed_run_s_cpu_time_follows_its_checkpoints():
    """Process 1 trains to update 300 and is killed (its last checkpoint at 250, its CPU time
    never recorded); process 2 resumes from 250. Updates 250-300 count once, as in one training."""
    samples = [sample(11, 0, 100, 100.0), sample(11, 0, 200, 200.0), sample(11, 0, 250, 250.0),
               sample(11, 0, 300, 300.0),
               sample(12, 250, 300, 70.0), sample(12, 250, 400, 170.0)]
    assert cpu_cost_path(samples) == [(100, 100.0), (200, 200.0), (250, 250.0), (300, 320.0), (400, 420.0)]
    assert cpu_seconds_at(samples, 200) == 200.0 and cpu_seconds_at(samples, 400) == 420.0
    assert cpu_seconds_at(samples, 401) is None
    # a process that starts again from scratch replaces everything before it
    assert cpu_cost_path(samples + [sample(13, 0, 100, 90.0)]) == [(100, 90.0)]


def test_an_older_trace_is_split_where_the_cpu_time_falls_and_placed_by_the_log_s_starts():
    legacy = [{"update": 100, "cpu_seconds": 100.0}, {"update": 300, "cpu_seconds": 300.0},
              # a process killed before it logged: its predecessor's update
              {"update": 300, "cpu_seconds": 0.5}, {"update": 300, "cpu_seconds": 27.0},
              {"update": 300, "cpu_seconds": 0.5}, {"update": 260, "cpu_seconds": 20.0},
              {"update": 400, "cpu_seconds": 170.0}]
    starts = [{"from_update": 0}, {"from_update": 250}, {"from_update": 250}]
    path = cpu_cost_path(legacy, starts)
    assert path == [(100, 100.0), (250, 250.0), (260, 270.0), (400, 420.0)]  # 250: between 100 and 300
    # a process of the new kind resumed later: the log's last start is its own
    later = legacy + [sample(14, 380, 450, 60.0)]
    assert cpu_cost_path(later, starts + [{"from_update": 380}])[-2:] == [(380, 398.6), (450, 458.6)]
    # without the log's starts the processes cannot be placed: each continues where the path ends
    assert cpu_cost_path(legacy) == [(100, 100.0), (300, 300.0), (400, 470.0)]


def test_the_curve_decodes_every_nth_epoch_and_prunes_the_others(tmp_path, monkeypatch):
    exp = experiment({"every": 5}, checkpoints=("best", "last3"))
    paths = RunPaths(tmp_path)
    paths.checkpoints.mkdir()
    for epoch in range(1, 13):
        (paths.checkpoints / f"checkpoint{epoch}.pt").write_text("weights")
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        (paths.checkpoints / name).write_text("weights")
    paths.cpu_trace.write_text("".join(json.dumps({"update": 100 * e, "cpu_seconds": 10.0 * e}) + "\n"
                                       for e in range(1, 13)))
    record = TranslationRunRecord(train={"curve": [{"epoch": e, "update": 100 * e, "valid_loss": 5.0 - e / 10}
                                                   for e in range(1, 13)]})
    decoded = []

    def fake_evaluate(data, checkpoint, subset, output_dir, **kwargs):
        decoded.append((checkpoint.name, subset))
        epoch = int(checkpoint.stem[len("checkpoint"):])
        return {"subset_name": "flickr", "scores": [{"name": "sacreBLEU", "score": float(epoch)},
                                                     {"name": "chrF2", "score": 2.0 * epoch}]}

    monkeypatch.setattr("fairseq_sret_cli.evaluation.evaluate.evaluate", fake_evaluate)
    curve = evaluate_curve(exp, paths, "bin", record)
    assert decoded == [("checkpoint5.pt", "test"), ("checkpoint10.pt", "test"), ("checkpoint12.pt", "test")]
    assert [(p["epoch"], p["update"], p["cpu_seconds"]) for p in curve] == [(5, 500, 50.0), (10, 1000, 100.0),
                                                                            (12, 1200, 120.0)]
    kept = sorted(p.name for p in paths.checkpoints.iterdir())
    assert kept == ["checkpoint10.pt", "checkpoint11.pt", "checkpoint12.pt", "checkpoint5.pt",
                    "checkpoint_best.pt", "checkpoint_last.pt"]  # the curve's, and the last 3 for last3
    assert json.loads(paths.record.read_text())["curve"] == curve  # written as it goes: a rerun continues
    decoded.clear()
    evaluate_curve(exp, paths, "bin", record)
    assert decoded == []

    lines = report.learning_curves(exp, [replace(record, row="sret", seed=1, status="done")], {"test": "flickr"})
    assert "| sret/seed1 | 10 | 1000 | 100 | 4.000 | 10.00 | 20.00 |" in lines


def test_recorded_commands_hold_no_paths_of_this_machine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inside, outside = tmp_path / "runs" / "a", tmp_path.parent / "elsewhere"
    assert portable(["-m", "fairseq_cli.train", str(inside), str(outside), "data-bin/x", str(tmp_path)]) == [
        "-m", "fairseq_cli.train", "runs/a", str(outside), "data-bin/x", "."]
