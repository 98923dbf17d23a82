"""The experiment runner: file validation, fairseq log parsing, and the whole loop on the
CPU (train two tiny rows side by side, evaluate, write JSON/markdown/plots, resume)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fairseq_sret_cli.experiment_runner import ExperimentError, parse_experiment, parse_training_log, training_summary
from fairseq_sret_cli.experiment_runner.records import TranslationRunRecord
from fairseq_sret_cli.hardware import cpu_model
from fairseq_sret_cli.toy import write_reversal_corpus

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def test_cpu_model_tells_apart_generations_sold_under_one_name():
    zen3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n"
    zen5 = zen3.replace("25", "26").replace(": 1\n", ": 2\n")
    assert cpu_model(zen3) == "AMD EPYC (family 25, model 1)" and cpu_model(zen5) == "AMD EPYC (family 26, model 2)"
    assert cpu_model("model name\t: Neoverse-V2\n") == "Neoverse-V2"  # no family or model line
    two = zen5 + "\nprocessor\t: 1\ncpu family\t: 99\nmodel\t\t: 9\nmodel name\t: other\n"
    assert cpu_model(two) == cpu_model(zen5)  # the first processor names the machine


LOG = """\
2026 | INFO | train_inner | {"epoch": 1, "update": 0.5, "loss": "5.8", "num_updates": "5", "wps": "16072", "wall": "2"}
2026 | INFO | valid | {"epoch": 1, "valid_loss": "4.935", "valid_num_updates": "10"}
2026 | INFO | train | {"epoch": 1, "train_loss": "5.5", "train_wps": "1000.5", "train_num_updates": "10", "train_wall": "20"}
2026 | INFO | valid | {"epoch": 2, "valid_loss": "4.673", "valid_num_updates": "20", "valid_best_loss": "4.673"}
2026 | INFO | train | {"epoch": 2, "train_loss": "4.9", "train_wps": "3000", "train_num_updates": "20", "train_wall": "41"}
2026 | INFO | valid | {"epoch": 3, "valid_loss": "4.80", "valid_num_updates": "30", "valid_best_loss": "4.673"}
2026 | INFO | train | {"epoch": 3, "train_loss": "4.7", "train_wps": "2000", "train_num_updates": "30", "train_wall": "60"}
2026 | INFO | fairseq_cli.train | done training in 60.0 seconds
"""


def test_training_log_gives_the_best_epoch_and_its_time():
    parsed = parse_training_log(LOG)
    assert parsed["done"] and [e["epoch"] for e in parsed["epochs"]] == [1, 2, 3]
    summary = training_summary(parsed)
    assert summary["best_valid_loss"] == pytest.approx(4.673)
    assert (summary["best_epoch"], summary["best_update"], summary["seconds_to_best"]) == (2, 20, 41)
    assert summary["train_tokens_per_second"] == 2000  # median over epochs
    assert [p["update"] for p in summary["curve"]] == [10, 20, 30]


def test_a_resumed_run_s_clock_continues_from_the_earlier_process():
    # fairseq's train_wall starts again at 0 in the process that resumes the run
    resumed = LOG.replace("done training in 60.0 seconds", "done training in 1.0 seconds") + (
        '2026 | INFO | valid | {"epoch": 4, "valid_loss": "4.6", "valid_num_updates": "40"}\n'
        '2026 | INFO | train | {"epoch": 4, "train_wps": "2000", "train_num_updates": "40", "train_wall": "15"}\n'
        '2026 | INFO | valid | {"epoch": 5, "valid_loss": "4.5", "valid_num_updates": "50"}\n'
        '2026 | INFO | train | {"epoch": 5, "train_wps": "2000", "train_num_updates": "50", "train_wall": "35"}\n')
    summary = training_summary(parse_training_log(resumed))
    assert [p["seconds"] for p in summary["curve"]] == [20, 41, 60, 75, 95]
    assert (summary["best_update"], summary["seconds_to_best"], summary["seconds"]) == (50, 95, 95)


def test_updates_trained_again_after_a_resume_or_a_restart_are_counted():
    start = "2026 | INFO | fairseq.trainer | "
    inner = '2026 | INFO | train_inner | {{"epoch": 1, "loss": "5", "num_updates": "{}"}}\n'
    log = (start + "No existing checkpoint found /x/checkpoint_last.pt\n" + inner.format(5)
           + start + "No existing checkpoint found /x/checkpoint_last.pt\n" + LOG.replace("done training", "")
           + inner.format(35) + start + "Loaded checkpoint /x/checkpoint_last.pt (epoch 4 @ 30 updates)\n"
           + inner.format(40))
    parsed = parse_training_log(log)
    assert parsed["starts"] == [{"from_update": 0, "reached": 5}, {"from_update": 0, "reached": 35},
                                {"from_update": 30, "reached": 40}]
    summary = training_summary(parsed)
    assert (summary["starts"], summary["repeated_updates"]) == (3, 5 + 5)
    # one process, no start line (an older log): nothing repeated
    assert (training_summary(parse_training_log(LOG))["starts"], training_summary(parse_training_log(LOG))[
        "repeated_updates"]) == (1, 0)
    # a continuation from another run's final checkpoint repeats nothing
    continued = LOG + start + "Loaded checkpoint /y/checkpoint_last.pt (epoch 4 @ 30 updates)\n" + inner.format(40)
    assert training_summary(parse_training_log(continued))["repeated_updates"] == 0


def test_the_report_lists_the_runs_that_took_several_processes():
    from fairseq_sret_cli.experiment_runner.report import restarted_runs

    runs = [TranslationRunRecord(row="a", seed=1, status="done", train_processes=2,
                                 train={"starts": 2, "repeated_updates": 88}),
            TranslationRunRecord(row="a", seed=2, status="done", train_processes=1, train={"starts": 1}),
            TranslationRunRecord(row="b", seed=1, status="training", train={"starts": 3})]
    lines = restarted_runs(runs)
    assert [line for line in lines if line.startswith("| a/")] == ["| a/seed1 | 2 | 2 | 88 |"]
    assert restarted_runs(runs[1:]) == []
    traced = TranslationRunRecord(row="a", seed=1, status="done", train=dict(runs[0].train, cpu_seconds=900.0))
    assert "| a/seed1 | 2 | all (CPU trace) | 88 |" in restarted_runs([traced])


def test_the_report_names_the_rows_whose_seeds_cannot_tell_them_apart():
    from fairseq_sret_cli.experiment_runner.report import close_rows

    def row(name, mean, std, n=2):
        return {"id": name, "stats": {"bleu": {"mean": mean, "std": std, "n": n}}}

    columns = [("bleu", "BLEU test")]
    lines = close_rows([row("a", 40.0, 0.5), row("b", 40.9, 0.2), row("c", 42.5, 0.3), row("d", 40.1, None, 1)],
                       columns)
    assert lines[-1:] == ["- `a` and `b`: BLEU test 40.00 against 40.90 (0.90 < 1.00)"]  # a-c, b-c apart; d: 1 seed
    assert close_rows([row("a", 40.0, 0.5), row("b", 41.0, 0.5)], columns) == []  # a gap of exactly 2 std


def test_the_report_says_when_runs_trained_on_several_devices():
    from fairseq_sret_cli.experiment_runner.report import mixed_devices, row_devices

    amd, xeon = "CPU AMD EPYC", "CPU Intel(R) Xeon(R) Processor"
    runs = [TranslationRunRecord(row=row, seed=seed, status=status, trained_on=on)
            for row, seed, status, on in [("a", 1, "done", [amd]), ("a", 2, "done", [xeon]), ("b", 1, "done", [amd]),
                                          ("c", 1, "done", [amd, xeon]), ("d", 1, "training", [xeon])]]
    text = " ".join(mixed_devices(runs))
    assert f"2 devices ({amd}; {xeon}" in text and "Rows whose seconds mix devices: `a`, `c`." in text
    assert mixed_devices([runs[0], runs[2]]) == [] and mixed_devices([runs[0], runs[4]]) == []
    assert row_devices(runs) == {"a": [amd, xeon], "b": [amd], "c": [amd, xeon]}  # "d" is not done
    assert row_devices([runs[0], runs[2]]) == {}


def minimal(**changes):
    raw = {"name": "x", "train": {"max_update": 10}, "rows": [{"id": "a", "arch": "transformer"}]}
    raw.update(changes)
    return raw


@pytest.mark.parametrize("raw,message", [
    (minimal(rows=[]), "no rows"),
    (minimal(rows=[{"id": "a"}]), "'arch' is required"),
    (minimal(rows=[{"id": "a", "arch": "t"}, {"id": "a", "arch": "t"}]), "repeat"),
    (minimal(rows=[{"id": "a b", "arch": "t"}]), "letters"),
    (minimal(rows=[{"id": "a", "arch": "t", "seeds": []}]), "seeds"),
    (minimal(rows=[{"id": "a", "arch": "t", "seeds": [1, 1]}]), "repeats a seed"),
    (minimal(train={}), "needs a cap"),
    (minimal(train={"max_update": -1}), "max_update"),
    (minimal(train={"max_update": 5, "epochs": 3}), "unknown fields"),
    (minimal(eval={"checkpoints": ["middle"]}), "eval.checkpoints"),
    (minimal(rows=[{"id": "u", "arch": "sret_transformer", "uptrain_from": "t"}]), "not an earlier row"),
    (minimal(rows=[{"id": "t", "arch": "transformer"},
                   {"id": "u", "arch": "sret_transformer", "uptrain_from": "t", "seeds": [1, 2]}]), r"has no seeds \[2\]"),
    (minimal(rows=[{"id": "t", "arch": "transformer"},
                   {"id": "u", "arch": "sret_transformer_tiny", "uptrain_from": "t"}]), "arch is sret_transformer"),
    (minimal(rows=[{"id": "u", "arch": "t", "uptrain_args": "--recursions 2"}]), "uptrain_args without uptrain_from"),
    # options the runner gives every run: the file's copy would be overridden without a word
    (minimal(rows=[{"id": "a", "arch": "t", "args": "--lr 1e-3 --max-update 500"}]),
     r"rows\[0\].args: --max-update is set by the runner .* give it as train.max_update, or the row's max_update"),
    (minimal(rows=[{"id": "a", "arch": "t", "args": ["--seed", 7]}]), "--seed is set by the runner"),
    (minimal(train={"max_update": 10, "args": "--patience=3"}), "train.args: --patience is set by the runner"),
    (minimal(train={"max_update": 10, "args": "--cpu"}), "give it as sret-experiments --cpu"),
])
def test_bad_experiment_files_name_the_field(raw, message):
    with pytest.raises(ExperimentError, match=message):
        parse_experiment(raw, "exp.yaml")


def test_selecting_rows_and_seeds():
    exp = parse_experiment(minimal(rows=[{"id": "a", "arch": "t", "seeds": [1, 2, 3]}, {"id": "b", "arch": "t"}]))
    assert [r.name for r in exp.runs()] == ["a/seed1", "a/seed2", "a/seed3", "b/seed1"]
    assert [r.name for r in exp.select(["b"]).runs()] == ["b/seed1"]
    assert [r.name for r in exp.select(None, [7]).runs()] == ["a/seed7", "b/seed7"]
    with pytest.raises(ExperimentError, match="no rows"):
        exp.select(["zz"])
    # what a selection's results report: every run of the file, and the seeds the selection adds
    assert [r.name for r in exp.with_runs_of(exp.select(["b"], [2])).runs()] == [
        "a/seed1", "a/seed2", "a/seed3", "b/seed1", "b/seed2"]
    assert exp.with_runs_of(exp.select(["a"], [2])).runs() == exp.runs()


def _row_record(row: str, seed: int, bleu: dict, cpu_seconds: float) -> TranslationRunRecord:
    """One finished run as the runner records it: BLEU and speed per decoded variant."""
    return TranslationRunRecord(
        status="done", row=row, seed=seed, train_cpu_seconds=cpu_seconds, model={"params": 6e6, "applications": "4+4"},
        train={"best_valid_loss": 4.1, "updates": 100, "curve": [{"update": 50, "seconds": 10, "valid_loss": 5.0},
                                                                 {"update": 100, "seconds": 20, "valid_loss": 4.1}]},
        eval={key: {"test": {"subset_name": "test_2016_flickr", "speed": {"sentences_per_second": 30.0 + seed},
                             "scores": [{"name": "BLEU", "score": score, "signature": "nrefs:1"}]}}
              for key, score in bleu.items()})


def test_figures_name_the_machine_and_the_command_and_draw_the_depth_curve(tmp_path):
    from PIL import Image

    from fairseq_sret_cli.experiment_runner.report import aggregate, plot

    raw = minimal(rows=[{"id": "sret", "arch": "sret_transformer_tiny", "seeds": [1, 2]},
                        {"id": "transformer", "arch": "transformer", "variants": [""]}],
                  eval={"checkpoints": ["last"], "subsets": ["test"], "variants": {"": "", "depth1": "--x"}})
    experiment = parse_experiment(raw, "exp.yaml")
    records = [_row_record("sret", 1, {"last": 37.0, "last@depth1": 25.0}, 2100.0),
               _row_record("sret", 2, {"last": 36.0, "last@depth1": 24.0}, 2200.0),
               _row_record("transformer", 1, {"last": 35.0}, 1500.0)]
    env = {"device": "CPU Some Processor 9000", "note": "2 runs side by side, 1 thread each", "torch": "2.13.0+cpu"}
    paths = plot(experiment, aggregate(experiment, records), records, tmp_path, env, "sret-experiments exp.yaml --cpu")
    assert sorted(p.name for p in paths.values()) == sorted(
        f"x_{suffix}.png" for suffix in ("valid_loss", "bleu_params", "bleu_cpu", "bleu_speed", "depth"))
    for path in paths.values():
        caption = Image.open(path).text["Description"]
        assert "CPU Some Processor 9000" in caption and "1 thread each" in caption and "torch 2.13.0+cpu" in caption
        assert "sret-experiments exp.yaml --cpu" in caption

    # no row decoded at two depths: no depth curve
    records = [r for r in records if r.row == "transformer"]
    experiment = parse_experiment(minimal(rows=[{"id": "transformer", "arch": "transformer"}],
                                          eval={"checkpoints": ["last"], "subsets": ["test"]}), "exp.yaml")
    (tmp_path / "one").mkdir()
    paths = plot(experiment, aggregate(experiment, records), records, tmp_path / "one", env, "cmd")
    assert "depth curve" not in paths and not (tmp_path / "one" / "x_depth.png").exists()

    # two checkpoint kinds (best, last) of one depth: no depth curve either
    records = [_row_record("transformer", 1, {"best": 34.0, "last": 35.0}, 1500.0)]
    experiment = parse_experiment(minimal(rows=[{"id": "transformer", "arch": "transformer"}],
                                          eval={"checkpoints": ["best", "last"], "subsets": ["test"]}), "exp.yaml")
    (tmp_path / "two").mkdir()
    paths = plot(experiment, aggregate(experiment, records), records, tmp_path / "two", env, "cmd")
    assert "depth curve" not in paths and not (tmp_path / "two" / "x_depth.png").exists()


@pytest.fixture(scope="module")
def toy_bin(tmp_path_factory):
    """The reversal corpus under Multi30k's file names, prepared like a real data set."""
    root = tmp_path_factory.mktemp("toy")
    raw = write_reversal_corpus(root / "raw", [("train", 1500), ("val", 60), ("test_2016_flickr", 40),
                                               ("test_2017_flickr", 40)], vocab_size=16)
    for path in list(raw.iterdir()):
        path.rename(path.with_suffix(".de" if path.suffix == ".src" else ".en"))
    subprocess.run([sys.executable, "-m", "fairseq_sret_cli.prepare", "multi30k", "--src", str(raw),
                    "--out", str(root / "bin"), "--vocab-size", "60"], check=True, capture_output=True)
    return root / "bin"


@pytest.mark.e2e
def test_runner_trains_evaluates_reports_and_resumes(toy_bin, tmp_path):
    cmd = [sys.executable, "-m", "fairseq_sret_cli.experiments", str(REPO / "examples/toy/experiments.yaml"),
           "--data", str(toy_bin), "--output", str(tmp_path / "runs"), "--results", str(tmp_path / "results"),
           "--cpu", "--jobs", "2", "--max-update", "30", "--progress-interval", "5"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    results = tmp_path / "results"
    for name in ("toy.json", "toy.md", "toy_valid_loss.png", "toy_bleu_params.png", "toy_bleu_cpu.png",
                 "toy_bleu_speed.png", "toy_depth.png"):
        assert (results / name).is_file() and (results / name).stat().st_size > 0, name
    data = json.loads((results / "toy.json").read_text())
    assert [r["id"] for r in data["rows"]] == ["transformer", "sret"]
    for row in data["rows"]:
        assert row["seeds_done"] == [1]
        stats = row["stats"]
        assert stats["params"]["mean"] > 0 and stats["best_valid_loss"]["mean"] > 0
        for kind in ("best", "last2"):
            for subset in ("valid", "test"):
                assert 0 <= stats[f"bleu/{kind}/{subset}"]["mean"] <= 100
                assert 0 <= stats[f"chrf/{kind}/{subset}"]["mean"] <= 100
                assert stats[f"speed/{kind}/{subset}"]["mean"] > 0
    # the SReT row is also decoded at depth 1 of its 2 recursions (the file's variant)
    assert data["rows"][1]["stats"]["bleu/best@depth1/test"]["mean"] >= 0
    assert "bleu/best@depth1/test" not in data["rows"][0]["stats"]  # the transformer row has no depth variant
    sret, transformer = (next(r for r in data["rows"] if r["id"] == i) for i in ("sret", "transformer"))
    assert sret["applications"] == "2+2" and transformer["applications"] == "2+2"
    assert sret["stats"]["params"]["mean"] < transformer["stats"]["params"]["mean"]  # shared layers count once
    runs = {(r["row"], r["seed"]): r for r in data["runs"]}
    assert runs[("sret", 1)]["train"]["updates"] == 30 and runs[("sret", 1)]["jobs"] == 2
    for record in runs.values():  # one training process each, its CPU time and processor recorded
        assert record["train_processes"] == 1 and record["train_cpu_seconds"] > 0
        assert record["trained_on"] == [f"CPU {cpu_model()}"]
    table = (results / "toy.md").read_text()
    assert "| SReT 1x2 (`sret`) |" in table and "`sret`: `--arch sret_transformer_tiny --encoder-layers 1" in table
    assert "signature" in table and "nrefs:1" in table
    assert "sret-experiments" in table  # the command that produced it

    # the run folders are bound to their settings: a changed cap is refused before anything starts
    edited = subprocess.run(cmd[:-4] + ["--max-update", "31"], capture_output=True, text=True, timeout=120)
    assert edited.returncode == 2 and "with other settings (--max-update 30 -> 31)" in edited.stderr, edited.stderr
    assert json.loads((results / "toy.json").read_text())["rows"] == data["rows"]

    # a run of one row reports the whole experiment: the other row stays in the table and counts as done
    one_row = subprocess.run(cmd + ["--rows", "sret"], capture_output=True, text=True, timeout=120)
    assert one_row.returncode == 0 and one_row.stderr.count("done already, skipped") == 1, one_row.stderr[-2000:]
    assert json.loads((results / "toy.json").read_text())["rows"] == data["rows"]

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count("done already, skipped") == 2 and "training (" not in again.stderr
    assert json.loads((results / "toy.json").read_text())["rows"] == data["rows"]

    # on another machine only the results file is there: its runs still count as done
    fresh = [c if c != str(tmp_path / "runs") else str(tmp_path / "elsewhere") for c in cmd]
    moved = subprocess.run(fresh, capture_output=True, text=True, timeout=120)
    assert moved.returncode == 0 and moved.stderr.count("done already, skipped") == 2, moved.stderr[-2000:]
    assert json.loads((results / "toy.json").read_text())["rows"] == data["rows"]
    # ... unless the configuration changed, and a time limit stops in time
    changed = subprocess.run(fresh[:-6] + ["--max-update", "31", "--time-limit", "0"], capture_output=True,
                             text=True, timeout=120)
    assert changed.returncode == 0, changed.stderr[-2000:]
    assert "time limit reached: 2 runs not finished" in changed.stderr and "skipped" not in changed.stderr
    stored = json.loads((results / "toy.json").read_text())
    assert all(row["seeds_done"] == [] for row in stored["rows"])
    assert sorted(r["row"] for r in stored["earlier_runs"]) == ["sret", "transformer"]  # never lost


UPTRAINING = """\
name: toy_uptraining
train:
  args: >-
    --share-all-embeddings --optimizer adam --adam-betas (0.9,0.98) --lr 3e-3
    --lr-scheduler inverse_sqrt --warmup-updates 10 --criterion label_smoothed_cross_entropy
    --label-smoothing 0.1 --max-tokens 1500 --num-workers 0
  max_update: 30
eval:
  beam: 2
  subsets: [test]
  checkpoints: [last]
rows:
  - id: teacher
    arch: transformer
    args: >-
      --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32
      --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2
      --decoder-attention-heads 2 --encoder-normalize-before --decoder-normalize-before
  - id: uptrained
    arch: sret_transformer
    uptrain_from: teacher
    uptrain_args: --recursions 2
    max_update: 20
"""


@pytest.mark.e2e
def test_an_uptrained_row_waits_for_its_teacher_and_fine_tunes_its_conversion(toy_bin, tmp_path):
    experiment = tmp_path / "uptraining.yaml"
    experiment.write_text(UPTRAINING)
    cmd = [sys.executable, "-m", "fairseq_sret_cli.experiments", str(experiment), "--data", str(toy_bin),
           "--output", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--cpu", "--jobs", "2"]
    dry = subprocess.run(cmd + ["--dry-run"], capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and "--finetune-from-model" in dry.stdout.splitlines()[1], dry.stderr[-2000:]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stderr
    # two jobs allowed, yet the student starts only after its teacher has been trained
    assert log.index("teacher/seed1: trained in") < log.index("uptrained/seed1: converted teacher/seed1")
    assert log.index("uptrained/seed1: converted") < log.index("uptrained/seed1: training")
    record = json.loads((tmp_path / "runs/uptrained/seed1/run.json").read_text())
    options = record["uptrain"]["model_options"]
    assert options[:2] == ["--arch", "sret_transformer"] and "--encoder-layers" in options
    assert record["command"][record["command"].index("--finetune-from-model") + 1].endswith("uptrained.pt")
    train_log = (tmp_path / "runs/uptrained/seed1/train.log").read_text()
    assert "loading pretrained model from" in train_log and "uptrained.pt" in train_log
    data = json.loads((tmp_path / "results/toy_uptraining.json").read_text())
    rows = {r["id"]: r for r in data["rows"]}
    assert rows["uptrained"]["seeds_done"] == [1] and rows["uptrained"]["applications"] == "2+2"
    assert rows["uptrained"]["stats"]["params"]["mean"] < rows["teacher"]["stats"]["params"]["mean"]
    assert data["runs"][1]["config"]["uptrain"] == {"from": "teacher", "args": ["--recursions", "2"]}


@pytest.mark.e2e
def test_an_uptrained_row_without_its_trained_teacher_fails_clearly(toy_bin, tmp_path):
    experiment = tmp_path / "uptraining.yaml"
    experiment.write_text(UPTRAINING)
    result = subprocess.run([sys.executable, "-m", "fairseq_sret_cli.experiments", str(experiment),
                             "--data", str(toy_bin), "--output", str(tmp_path / "runs"), "--results",
                             str(tmp_path / "results"), "--cpu", "--rows", "uptrained"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "uptrained/seed1: uptraining FAILED" in result.stderr and "which is not done" in result.stderr
    assert json.loads((tmp_path / "runs/uptrained/seed1/run.json").read_text())["status"] == "failed"


@pytest.mark.e2e  # prepares the toy data-bin and runs the command
def test_unknown_row_is_an_error(toy_bin, tmp_path):
    result = subprocess.run([sys.executable, "-m", "fairseq_sret_cli.experiments",
                             str(REPO / "examples/toy/experiments.yaml"), "--data", str(toy_bin),
                             "--rows", "nope", "--dry-run"], capture_output=True, text=True)
    assert result.returncode == 2 and "no rows ['nope']" in result.stderr


def test_progress_prints_updates_done_of_total_and_the_expected_time():
    import io

    from fairseq_sret_cli.experiment_runner.progress import TrainingProgress

    now = [0.0]
    out = io.StringIO()
    progress = TrainingProgress(total=100, every=30, prefix="[quickstart]", out=out, clock=lambda: now[0])

    def inner(update, loss):
        return f'2026 | INFO | train_inner | {{"epoch": 1, "loss": "{loss}", "num_updates": "{update}"}}\n'

    for t, update in ((5, 10), (25, 20), (65, 40), (100, 100)):
        now[0] = t
        progress.feed(inner(update, 5.0))
    progress.feed("2026 | INFO | valid | {\"epoch\": 1, \"valid_loss\": \"4.2\", \"valid_best_loss\": \"4.2\"}\n")
    progress.feed("Traceback (most recent call last):\n")
    progress.feed("2026 | INFO | fairseq.utils | nothing to see\n")
    lines = out.getvalue().splitlines()
    # 10 updates in the first 20 s after the first record: 2 s per update, 200 s in all
    assert "[quickstart] update 20/100 (20%), loss 5.0, 0.50 updates/s, ~3 min left" in lines
    assert any(line.startswith("[quickstart] expected training time on this machine: ~") for line in lines)
    assert "[quickstart] update 100/100 (100%)" in "\n".join(lines)
    assert "[quickstart] epoch 1: valid loss 4.2 (best 4.2)" in lines
    assert "Traceback (most recent call last):" in lines and not any("nothing to see" in x for x in lines)


def test_progress_counts_down_to_a_time_limit_that_comes_before_the_last_update():
    import io

    from fairseq_sret_cli.experiment_runner.progress import TrainingProgress

    now = [0.0]
    out = io.StringIO()
    progress = TrainingProgress(total=100000, every=30, prefix="[quickstart]", out=out, clock=lambda: now[0], minutes=10)
    for t, update in ((5, 10), (65, 70), (125, 130)):
        now[0] = t
        progress.feed(f'2026 | INFO | train_inner | {{"loss": "5.0", "num_updates": "{update}", "wall": "{t}"}}\n')
    lines = out.getvalue().splitlines()
    # 1 update/s and update 70 at 65 s of training: about update 605 at the 600 s limit
    assert "[quickstart] training stops at the time limit, 10 min: about 605 of 100000 updates at 1.00 s each" in lines
    assert "[quickstart] update 130, 21% of the 10 min limit, loss 5.0, 1.00 updates/s, ~8 min left" in lines


def test_reaping_a_training_process_gives_its_own_cpu_time():
    from fairseq_sret_cli.experiment_runner.cpu_time import add_cpu_seconds, reap

    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    busy = subprocess.Popen([sys.executable, "-c", burn])
    code, busy_seconds = reap(busy, block=True)
    assert reap(busy) == (0, 0.0)  # reaped already: counted once
    code_idle, idle_seconds = reap(idle, block=True)
    assert code == code_idle == 0
    assert 0.4 <= busy_seconds < 2.0 and idle_seconds < 0.35  # the sleeping child is not charged the busy one's time
    record = TranslationRunRecord()
    add_cpu_seconds(record, busy_seconds)
    add_cpu_seconds(record, idle_seconds)  # a resumed run: the processes add up
    assert record.train_processes == 2
    assert record.train_cpu_seconds == pytest.approx(busy_seconds + idle_seconds, abs=0.1)


def test_asking_whether_a_training_still_runs_leaves_its_cpu_time_to_the_reaping():
    """The runner asks whether a converged training still runs before stopping it; a training
    that has just ended must still be charged its CPU time when it is reaped."""
    from fairseq_sret_cli.experiment_runner.cpu_time import is_running, reap

    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass"
    busy = subprocess.Popen([sys.executable, "-c", burn])
    assert is_running(busy)
    deadline = time.time() + 30
    while is_running(busy) and time.time() < deadline:
        time.sleep(0.05)
    assert not is_running(busy)  # ended, not reaped
    code, seconds = reap(busy)
    assert code == 0 and seconds >= 0.4
    assert not is_running(busy)
