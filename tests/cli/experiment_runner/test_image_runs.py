"""sret-experiments with an experiment file of kind: vision (sret-train-cifar runs)."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("timm")
Image = pytest.importorskip("PIL.Image")

from fairseq_sret_cli import experiments  # noqa: E402
from fairseq_sret_cli.experiment_runner import ExperimentError  # noqa: E402
from fairseq_sret_cli.experiment_runner.image_runs import parse_image_experiment  # noqa: E402
from fairseq_sret_cli.experiment_runner.records import ImageRunRecord  # noqa: E402

FAST = ("--epochs 1 --batch-size 4 --val-split 4 --max-steps-per-epoch 1 --log-interval 0 --threads 1"
        " --eval-batch-size 8")


def experiment_file(tmp_path, rows, args=FAST, **fields):
    path = tmp_path / "ladder.yaml"
    path.write_text(json.dumps({"kind": "vision", "name": "tiny_ladder", "title": "tiny", "seeds": [1],
                                "train": {"args": args}, "rows": rows, **fields}))
    return path


@pytest.fixture
def images(tmp_path):
    g = np.random.default_rng(0)
    for split, n in (("train", 6), ("test", 2)):
        for label, name in enumerate(("a", "b")):
            (tmp_path / "data" / split / name).mkdir(parents=True)
            for i in range(n):
                colour = np.array([200 * (1 - label), 60, 200 * label])
                img = np.clip(colour + g.integers(-30, 31, (32, 32, 3)), 0, 255)
                Image.fromarray(img.astype(np.uint8)).save(tmp_path / "data" / split / name / f"{i}.png")
    return tmp_path / "data"


@pytest.mark.parametrize("row, message", [
    ({"id": "r", "model": "sret_cifar", "args": "--seed 3"}, "--seed is set by the runner"),
    ({"id": "r", "model": "sret_cifar", "seeds": [1, 1]}, "distinct"),
    ({"id": "r"}, "needs an 'id' and a 'model'"),
    ({"id": "r", "model": "sret_cifar", "epochs": 3}, "unknown fields"),
])
@pytest.mark.reliability("inputs-as-they-seem")
def test_rows_that_the_runner_would_override_or_misread_are_refused(tmp_path, row, message):
    with pytest.raises(ExperimentError, match=message):
        parse_image_experiment(json.loads(experiment_file(tmp_path, [row]).read_text()), "ladder.yaml")


@pytest.mark.parametrize("max_seeds, message", [(1, "integer of 2 or more"), ("3", "integer of 2 or more"),
                                                (2, "3 seeds, more than max_seeds")])
@pytest.mark.reliability("inputs-as-they-seem")
def test_a_seed_cap_that_no_pair_could_reach_or_a_row_exceeds_is_refused(tmp_path, max_seeds, message):
    row = {"id": "r", "model": "sret_cifar", "seeds": [1, 2, 3]}
    with pytest.raises(ExperimentError, match=message):
        parse_image_experiment(json.loads(experiment_file(tmp_path, [row], max_seeds=max_seeds).read_text()),
                               "ladder.yaml")


def test_runs_train_resume_and_report_row_by_row(images, tmp_path):
    rows = [{"id": "baseline", "title": "baseline", "model": "sret_cifar_baseline"},
            {"id": "sret", "title": "SReT", "model": "sret_cifar", "args": "--model-kwargs stem=patch"}]
    path = experiment_file(tmp_path, rows)
    common = [str(path), "--data", str(images), "--output", str(tmp_path / "runs"),
              "--results", str(tmp_path / "res")]
    assert experiments.main([*common, "--rows", "baseline"]) == 0
    table = (tmp_path / "res" / "tiny_ladder.md").read_text()
    assert "| baseline | `sret_cifar_baseline` |" in table
    assert "| SReT | `sret_cifar` | | | | | | | missing (seeds 1)" in table
    result = json.loads((tmp_path / "runs" / "baseline" / "seed1" / "result.json").read_text())
    assert result["settings"]["seed"] == 1 and result["model"] == "sret_cifar_baseline"
    baseline_line = next(line for line in table.splitlines() if line.startswith("| baseline |"))
    assert f"{result['cpu_seconds']:,.0f} ({result['cpu']}) |" in baseline_line  # seconds of a named processor

    assert experiments.main(common) == 0  # the baseline is done already; SReT trains now
    report = json.loads((tmp_path / "res" / "tiny_ladder.json").read_text())
    assert [(r["row"], r["status"]) for r in report["runs"]] == [("baseline", "done"), ("sret", "done")]
    assert report["runs"][1]["result"]["model_kwargs"]["stem"] == "patch"
    assert (tmp_path / "res" / "tiny_ladder_curves.png").stat().st_size > 0
    assert "missing" not in (tmp_path / "res" / "tiny_ladder.md").read_text()
    # committed results have no manifest in a clone: they are recognised by the JSON naming them
    (tmp_path / "res" / ".sret-outputs.json").unlink()
    assert experiments.main([*common, "--report-only"]) == 0
    # a file of the same name that this experiment did not write stays in the way
    (tmp_path / "res" / ".sret-outputs.json").unlink()
    (tmp_path / "res" / "tiny_ladder.json").write_text('{"experiment": "another"}')
    assert experiments.main([*common, "--report-only"]) == 2


def test_a_run_folder_trained_with_other_settings_fails_that_run(images, tmp_path):
    rows = [{"id": "sret", "model": "sret_cifar"}]
    common = ["--data", str(images), "--output", str(tmp_path / "runs"), "--results", str(tmp_path / "res")]
    # an interrupted run (a checkpoint, no result), then the file's schedule is edited
    path = experiment_file(tmp_path, rows, FAST.replace("--epochs 1", "--epochs 2"))
    assert experiments.main([str(path), *common]) == 0
    (tmp_path / "runs" / "sret" / "seed1" / "result.json").unlink()
    path = experiment_file(tmp_path, rows, FAST.replace("--epochs 1", "--epochs 3"))
    assert experiments.main([str(path), *common]) == 1
    assert "other settings (epochs: 2 -> 3)" in (tmp_path / "runs" / "sret" / "seed1" / "train.log").read_text()


@pytest.mark.reliability("tied-to-inputs")
def test_a_result_of_other_settings_is_not_done(images, tmp_path):
    rows = [{"id": "sret", "model": "sret_cifar"}]
    common = ["--data", str(images), "--output", str(tmp_path / "runs"), "--results", str(tmp_path / "res")]
    assert experiments.main([str(experiment_file(tmp_path, rows)), *common]) == 0
    # the file's schedule is edited after the run finished: its old scores are not reported
    path = experiment_file(tmp_path, rows, FAST.replace("--epochs 1", "--epochs 2"))
    assert experiments.main([str(path), *common]) == 1  # the training command refuses the old run
    assert "other settings (epochs: 1 -> 2)" in (tmp_path / "runs" / "sret" / "seed1" / "train.log").read_text()
    assert "missing (seeds 1)" in (tmp_path / "res" / "tiny_ladder.md").read_text()


@pytest.mark.reliability("tied-to-inputs")
def test_runs_the_results_file_records_are_done_on_the_same_data_only(images, tmp_path, capsys):
    rows = [{"id": "baseline", "title": "baseline", "model": "sret_cifar_baseline"},
            {"id": "sret", "title": "SReT", "model": "sret_cifar"}]
    path = experiment_file(tmp_path, rows)
    common = [str(path), "--data", str(images), "--results", str(tmp_path / "res")]
    assert experiments.main([*common, "--output", str(tmp_path / "runs"), "--rows", "baseline"]) == 0
    baseline = json.loads((tmp_path / "res" / "tiny_ladder.json").read_text())["runs"][0]
    # another machine: the committed results, no run folders; --report-only keeps the finished row
    (tmp_path / "res" / ".sret-outputs.json").unlink()
    clone = ["--output", str(tmp_path / "clone-runs")]
    assert experiments.main([*common, *clone, "--report-only"]) == 0
    report = json.loads((tmp_path / "res" / "tiny_ladder.json").read_text())
    assert [(r["row"], r["status"]) for r in report["runs"]] == [("baseline", "done"), ("sret", "missing")]
    assert report["runs"][0]["result"] == baseline["result"] and report["runs"][0]["history"] == baseline["history"]
    # training trains only what is missing
    capsys.readouterr()
    assert experiments.main([*common, *clone]) == 0
    assert "baseline/seed1: done already (recorded in" in capsys.readouterr().err
    assert not (tmp_path / "clone-runs" / "baseline").exists()
    assert (tmp_path / "clone-runs" / "sret" / "seed1" / "result.json").is_file()
    # the same images with one relabelled: the recorded runs are of other data and train again
    (images / "train" / "a" / "0.png").rename(images / "train" / "b" / "moved.png")
    capsys.readouterr()
    assert experiments.main([*common, "--output", str(tmp_path / "other-data"), "--rows", "baseline"]) == 0
    assert "records it, but its data fingerprints differ" in capsys.readouterr().err
    assert (tmp_path / "other-data" / "baseline" / "seed1" / "result.json").is_file()


@pytest.mark.reliability("one-line-errors")
@pytest.mark.parametrize("args, message", [
    ("--aa rand-zz", "unknown section 'zz'"),
    ("--model-kwargs num_classes=7", "num_classes"),
    ("--lr inf", "--lr"),
    ("--epochs 0", "--epochs"),
])
def test_arguments_the_training_would_refuse_stop_the_runner_before_any_run(images, tmp_path, capsys, args, message):
    rows = [{"id": "baseline", "model": "sret_cifar_baseline"}, {"id": "sret", "model": "sret_cifar", "args": args}]
    path = experiment_file(tmp_path, rows)
    rc = experiments.main([str(path), "--data", str(images), "--output", str(tmp_path / "runs"),
                           "--results", str(tmp_path / "res")])
    err = capsys.readouterr().err
    assert rc == 2 and "row sret:" in err and message in err, err
    assert not (tmp_path / "runs" / "baseline").exists()  # nothing trained


def test_a_time_limit_stops_the_trainings_in_time_to_report(images, tmp_path, capsys):
    long = FAST.replace("--epochs 1", "--epochs 400")
    path = experiment_file(tmp_path, [{"id": "sret", "title": "SReT", "model": "sret_cifar"}], args=long)
    common = [str(path), "--data", str(images), "--output", str(tmp_path / "runs"), "--results", str(tmp_path / "res")]
    assert experiments.main([*common, "--time-limit", "0.1"]) == 0
    err = capsys.readouterr().err
    assert "time limit reached: 1 runs not finished (sret/seed1)" in err, err
    assert "sret/seed1: training (started)" in err  # it was stopped while training, not before
    assert not (tmp_path / "runs" / "sret" / "seed1" / "result.json").exists()
    assert "missing (seeds 1)" in (tmp_path / "res" / "tiny_ladder.md").read_text()


def done_run(row, seed, top1, val=None, epoch_cpu=(10.0,), cpu="a CPU"):
    """A finished run's record as the runner keeps it: test top-1 ``top1``, validation top-1
    ``val`` at its last epoch (default ``top1``) and the CPU seconds of its epochs on ``cpu``."""
    val = top1 if val is None else val
    history = [{"epoch": i, "val_acc1": val, "cpu_seconds": seconds, "cpu": cpu}
               for i, seconds in enumerate(itertools.accumulate(epoch_cpu))]
    result = {"params": 1, "macs": 1e6, "cpu_seconds": history[-1]["cpu_seconds"], "cpu": cpu,
              "epochs": len(history), "test": {"": {"acc1": top1}}, "val": val}
    return ImageRunRecord(row, seed, "done", result, history)


def test_the_table_names_the_rows_whose_seeds_cannot_tell_them_apart(tmp_path):
    from fairseq_sret_cli.experiment_runner.report import write_image_results

    rows = [{"id": i, "title": i, "model": "sret_cifar"} for i in ("a", "b", "c")]
    experiment = parse_image_experiment(json.loads(experiment_file(tmp_path, rows).read_text()), "ladder.yaml")

    records = [done_run(*run) for run in (("a", 1, 70.0), ("a", 2, 71.0), ("b", 1, 71.2), ("b", 2, 71.4),
                                          ("c", 1, 75.0), ("c", 2, 75.2))]
    table = (write_image_results(experiment, records, tmp_path / "res", "cmd")["md"]).read_text()
    close = [line for line in table.splitlines() if line.startswith("- `")]
    assert close == ["- `a` and `b`: validation top-1 70.50 against 71.30 (0.80 < 1.41)"], table  # c is apart
    assert "a further seed is due:" in table


def test_a_close_pair_at_the_study_s_last_seed_is_open_not_due_another(tmp_path):
    from fairseq_sret_cli.experiment_runner.report import write_image_results

    rows = [{"id": i, "title": i, "model": "sret_cifar", "seeds": [1, 2, 3]} for i in ("a", "b", "c")]
    raw = json.loads(experiment_file(tmp_path, rows, max_seeds=3).read_text())
    experiment = parse_image_experiment(raw, "ladder.yaml")

    records = [done_run(*run) for run in (("a", 1, 70.0), ("a", 2, 71.0), ("a", 3, 70.5), ("b", 1, 71.2),
                                          ("b", 2, 71.4), ("c", 1, 70.4), ("c", 2, 70.6), ("c", 3, 70.5))]
    table = (write_image_results(experiment, records, tmp_path / "res", "cmd")["md"]).read_text()
    close = [line for line in table.splitlines() if line.startswith("- `")]
    assert close == ["- `a` and `b`: validation top-1 70.50 against 71.30 (0.80 < 1.00): a further seed is due",
                     "- `a` and `c`: validation top-1 70.50 against 70.50 (0.00 < 1.00): open at 3 seeds each"], table


def test_a_further_seed_is_decided_on_validation_top1_never_on_test(tmp_path):
    from fairseq_sret_cli.experiment_runner.report import write_image_results

    rows = [{"id": i, "title": i, "model": "sret_cifar"} for i in ("a", "b", "c")]
    experiment = parse_image_experiment(json.loads(experiment_file(tmp_path, rows).read_text()), "ladder.yaml")
    # a and b: test means close, validation apart; a and c: validation close, test apart
    records = [done_run(*run) for run in (("a", 1, 70.0, 80.0), ("a", 2, 71.0, 81.0), ("b", 1, 70.2, 90.0),
                                          ("b", 2, 71.2, 90.5), ("c", 1, 90.0, 80.2), ("c", 2, 90.4, 81.2))]
    table = (write_image_results(experiment, records, tmp_path / "res", "cmd")["md"]).read_text()
    close = [line for line in table.splitlines() if line.startswith("- `")]
    assert close == ["- `a` and `c`: validation top-1 80.50 against 80.70 (0.20 < 1.41)"], table
    a_line = next(line for line in table.splitlines() if line.startswith("| a |"))
    assert "| 80.50 ± 0.71 | 70.50 ± 0.71 |" in a_line  # validation, then test


def test_epoch_cpu_seconds_are_the_median_epoch_of_each_processor():
    from fairseq_sret_cli.experiment_runner.report import epoch_cpu_seconds

    run = done_run("a", 1, 70.0, epoch_cpu=(10.0, 30.0, 12.0, 11.0))
    assert epoch_cpu_seconds(run) == {"a CPU": 11.5}  # the slow epoch does not move it
    # epochs logged before processors were: the run's processor when it names one only
    for h in run.history:
        del h["cpu"]
    assert epoch_cpu_seconds(run) == {"a CPU": 11.5}
    run.result["cpu"] = "X + Y"
    run.history[-1]["cpu"] = "Y"
    assert epoch_cpu_seconds(run) == {"Y": 11.0}  # the unnamed epochs of a resumed run are nobody's
    run.history = []
    assert epoch_cpu_seconds(run) == {}


def test_cpu_time_is_the_median_and_range_of_runs_on_one_processor(tmp_path):
    from fairseq_sret_cli.experiment_runner.report import write_image_results

    rows = [{"id": i, "title": i, "model": "sret_cifar", "seeds": [1, 2, 3]} for i in ("a", "b", "c")]
    experiment = parse_image_experiment(json.loads(experiment_file(tmp_path, rows).read_text()), "ladder.yaml")
    records = [done_run("a", 1, 70.0, epoch_cpu=(10.0, 11.0, 10.0)), done_run("a", 2, 70.0, epoch_cpu=(12.0, 12.0)),
               done_run("a", 3, 70.0, epoch_cpu=(30.0,), cpu="slow CPU"),
               done_run("b", 1, 70.0, epoch_cpu=(20.0, 21.0, 20.0)), done_run("b", 2, 70.0, epoch_cpu=(30.0,)),
               done_run("b", 3, 70.0, epoch_cpu=(25.0,)),
               done_run("c", 1, 70.0, epoch_cpu=(50.0,), cpu="other CPU")]
    table = (write_image_results(experiment, records, tmp_path / "res", "cmd")["md"]).read_text()
    rows_table, ratios = table.split("Training CPU time against `a`")
    cells = {line.split(" | ")[0][2:]: line.split(" | ")[5] for line in rows_table.splitlines() if line.startswith("| ")}
    assert cells["a"] == "11.0 (10.0-12.0) (a CPU, 2 runs); 30.0 (slow CPU, 1 run)"
    assert cells["b"] == "25.0 (20.0-30.0) (a CPU, 3 runs)"
    # b against a on the processor both trained on; c shares none with a
    assert [line for line in ratios.splitlines() if line.startswith("| `")] == ["| `b` | a CPU | 3, 2 | 2.27 (1.67-3.00) |"]


@pytest.mark.parametrize("name", ["ladder", "cct"])
def test_the_committed_cifar10_experiments_name_models_and_options_the_training_takes(name):
    import yaml

    from fairseq_sret.vision import list_models
    from fairseq_sret_cli.train_cifar import check_command

    path = Path(__file__).parents[3] / "examples" / "cifar10" / f"{name}.yaml"
    experiment = parse_image_experiment(yaml.safe_load(path.read_text()), path)
    for row in experiment.rows:
        assert row.model in list_models(), row.id
        check_command(["--data-dir", "data", "--model", row.model, *experiment.args, *row.args, "--output", "run"])


def test_the_progress_line_gives_the_last_epoch_and_the_cpu_time_left(tmp_path):
    from fairseq_sret_cli.experiment_runner.image_runs import ImageTraining, progress_line

    training = ImageTraining("cct_2/seed1", process=None, log_file=None, folder=tmp_path, command=[], epochs=10)
    assert progress_line(training) == "cct_2/seed1: no epoch of 10 finished yet"
    # cumulative CPU seconds: epochs of 100, 120 and 110 s; the pace is their median
    history = [{"epoch": e, "val_acc1": v, "cpu_seconds": c} for e, v, c in ((0, 30.0, 100.0), (1, 41.5, 220.0),
                                                                          (2, 47.25, 330.0))]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))
    assert progress_line(training) == ("cct_2/seed1: epoch 3/10, validation top-1 47.25%, 110 CPU s an epoch,"
                                       " about 0.2 CPU-hours left")


def test_the_runner_says_how_each_image_training_goes_every_progress_interval(tmp_path, images, capsys):
    path = experiment_file(tmp_path, [{"id": "baseline", "model": "sret_cifar_baseline"}],
                           args=FAST.replace("--epochs 1", "--epochs 3"))
    assert experiments.main([str(path), "--data", str(images), "--output", str(tmp_path / "runs"),
                             "--results", str(tmp_path / "results"), "--progress-interval", "0.01"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[experiments] baseline/seed1: ")]
    assert any("/3, validation top-1 " in line and "CPU-hours left" in line for line in lines), lines
    assert experiments.main([str(path), "--data", str(images), "--output", str(tmp_path / "quiet"),
                             "--results", str(tmp_path / "results2"), "--progress-interval", "0"]) == 0
    assert not [line for line in capsys.readouterr().err.splitlines() if "CPU-hours left" in line]
