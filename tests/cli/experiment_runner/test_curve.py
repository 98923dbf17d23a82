"""The runner's learning curve: BLEU of every Nth epoch checkpoint against the training CPU
seconds it cost (``eval.curve``), the CPU-time trace it reads, and the epoch checkpoints it
keeps."""

import json
import os
import subprocess
import sys
import time

import pytest

from fairseq_sret_cli.experiment_runner import parse_experiment, train_command
from fairseq_sret_cli.experiment_runner import report, runner
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
    paths = runner.RunPaths(tmp_path)
    plain = train_command(experiment(), experiment().runs()[0], "bin", paths)
    assert plain[plain.index("--keep-last-epochs") + 1] == "3"
    curved = experiment({"every": 5})
    assert "--keep-last-epochs" not in train_command(curved, curved.runs()[0], "bin", paths)


def test_a_run_with_a_curve_is_another_configuration():
    run = experiment().runs()[0]
    assert runner.run_config(experiment(), run) != runner.run_config(experiment({"every": 5}), run)
    assert "curve" not in runner.run_config(experiment(), run)["eval"]  # older results stay valid


def test_cpu_seconds_at_an_update_is_the_first_sample_that_reached_it():
    samples = [{"update": 50, "cpu_seconds": 60.0}, {"update": 90, "cpu_seconds": 90.5},
               {"update": 140, "cpu_seconds": 121.0}]
    assert runner.cpu_seconds_at(samples, 90) == 90.5
    assert runner.cpu_seconds_at(samples, 91) == 121.0
    assert runner.cpu_seconds_at(samples, 10) == 60.0
    assert runner.cpu_seconds_at(samples, 141) is None


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads Linux's /proc")
def test_the_trace_samples_a_process_s_cpu_time_against_its_logged_update(tmp_path):
    paths = runner.RunPaths(tmp_path)
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 0.6: pass\nprint('busy', flush=True)\ntime.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline().strip() == "busy"  # it has used at least 0.6 s of CPU
        trace = runner.CpuTrace(paths, busy.pid, offset=100.0, interval=0.0)
        trace.poll(time.time())  # no log yet: nothing to pair the CPU time with
        assert not paths.cpu_trace.exists()
        paths.train_log.write_text('x | INFO | train_inner | {"epoch": 1, "num_updates": "50", "loss": "3"}\n'
                                   'x | INFO | valid | {"epoch": 1, "valid_loss": "2", "valid_num_updates": "7')
        trace.poll(time.time())
        with open(paths.train_log, "a") as log:  # the cut line ends; a later record follows
            log.write('0"}\nx | INFO | train | {"epoch": 1, "train_num_updates": "80"}\n')
        trace.poll(time.time())
    finally:
        busy.kill()
        busy.wait()
    samples = runner.read_cpu_trace(paths)
    assert [s["update"] for s in samples] == [50, 80]
    assert 100.5 <= samples[0]["cpu_seconds"] <= samples[1]["cpu_seconds"] < 130


def test_the_curve_decodes_every_nth_epoch_and_prunes_the_others(tmp_path, monkeypatch):
    exp = experiment({"every": 5}, checkpoints=("best", "last3"))
    paths = runner.RunPaths(tmp_path)
    paths.checkpoints.mkdir()
    for epoch in range(1, 13):
        (paths.checkpoints / f"checkpoint{epoch}.pt").write_text("weights")
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        (paths.checkpoints / name).write_text("weights")
    paths.cpu_trace.write_text("".join(json.dumps({"update": 100 * e, "cpu_seconds": 10.0 * e}) + "\n"
                                       for e in range(1, 13)))
    record = {"train": {"curve": [{"epoch": e, "update": 100 * e, "valid_loss": 5.0 - e / 10}
                                  for e in range(1, 13)]}}
    decoded = []

    def fake_evaluate(data, checkpoint, subset, output_dir, **kwargs):
        decoded.append((checkpoint.name, subset))
        epoch = int(checkpoint.stem[len("checkpoint"):])
        return {"subset_name": "flickr", "scores": [{"name": "sacreBLEU", "score": float(epoch)},
                                                     {"name": "chrF2", "score": 2.0 * epoch}]}

    monkeypatch.setattr("fairseq_sret_cli.evaluation.evaluate.evaluate", fake_evaluate)
    curve = runner.evaluate_curve(exp, paths, "bin", record)
    assert decoded == [("checkpoint5.pt", "test"), ("checkpoint10.pt", "test"), ("checkpoint12.pt", "test")]
    assert [(p["epoch"], p["update"], p["cpu_seconds"]) for p in curve] == [(5, 500, 50.0), (10, 1000, 100.0),
                                                                            (12, 1200, 120.0)]
    kept = sorted(p.name for p in paths.checkpoints.iterdir())
    assert kept == ["checkpoint10.pt", "checkpoint11.pt", "checkpoint12.pt", "checkpoint5.pt",
                    "checkpoint_best.pt", "checkpoint_last.pt"]  # the curve's, and the last 3 for last3
    assert json.loads(paths.record.read_text())["curve"] == curve  # written as it goes: a rerun continues
    decoded.clear()
    runner.evaluate_curve(exp, paths, "bin", record)
    assert decoded == []

    lines = report.learning_curves(exp, [dict(record, row="sret", seed=1, status="done")], {"test": "flickr"})
    assert "| sret/seed1 | 10 | 1000 | 100 | 4.000 | 10.00 | 20.00 |" in lines


def test_recorded_commands_hold_no_paths_of_this_machine(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inside, outside = tmp_path / "runs" / "a", tmp_path.parent / "elsewhere"
    assert runner.portable(["-m", "fairseq_cli.train", str(inside), str(outside), "data-bin/x", str(tmp_path)]) == [
        "-m", "fairseq_cli.train", "runs/a", str(outside), "data-bin/x", "."]
