"""Bad input to our commands, as a user gives it: each case is a test (test_bad_input_table.py)
and a row of docs/reliability.md (``python tests/bad_input_cases.py > docs/reliability.md``).

A case names the input in words, makes the files it needs in a fresh folder, runs one command
there and says what its error must name. ``sret-*`` commands must exit non-zero with one line
``PROG: error: ...`` on stderr (no traceback); fairseq's own commands keep fairseq's traceback,
whose last line must name the problem. Either way the files in the folder must be as they were.
"""

import hashlib
import os
import random
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


@dataclass
class Case:
    id: str
    input: str  # what the user gave, in words
    argv: List[str]  # the command line, run in the case's folder
    message: str  # text the error must contain
    setup: Callable[[Path], None] = lambda folder: None
    #: "sret": one line, no traceback; "fairseq": fairseq's traceback, the last line names it
    style: str = "sret"
    #: needs the shared trained checkpoint and data-bins (fairseq-train: the e2e tier)
    needs_model: bool = False
    kept: List[str] = field(default_factory=list)  # files the command may add (none by default)

    @property
    def command(self) -> str:
        return self.argv[0]

    @property
    def needs_fairseq(self) -> bool:
        """Run only where the 'fairseq' extra is installed: translation commands and their
        checkpoints."""
        return self.needs_model or self.command in TRANSLATION_COMMANDS or self.command.startswith("fairseq")


#: the commands that need the 'fairseq' extra (fairseq, sacreBLEU, sacremoses), or whose cases
#: are built from fairseq checkpoints
TRANSLATION_COMMANDS = {"sret-prepare", "sret-evaluate", "sret-uptrain", "sret-average-checkpoints"}


# ---------------------------------------------------------------- file makers
def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def transformer_checkpoint(folder: Path, name: str = "transformer.pt", layers: int = 4,
                           break_shape: Optional[str] = None, arch: str = "transformer") -> None:
    """A small fairseq transformer checkpoint (random weights) as fairseq-train saves it."""
    sys.path.insert(0, str(REPO / "tests"))
    import torch

    from fairseq_sret.checkpoints import save_checkpoint
    from fairseq_sret_cli.toy import architecture_args
    from nmt_helpers import SMALL, build

    kw = dict(SMALL, encoder_layers=layers, decoder_layers=2, dropout=0.0)
    torch.manual_seed(0)
    model, _ = build(arch, **kw)
    args = architecture_args(arch, **kw)
    args.arch = args._name = arch
    weights = model.state_dict()
    if break_shape:  # one layer's weight no longer fits the configuration
        weights[break_shape] = weights[break_shape][:, :-1].clone()
    save_checkpoint({"args": None, "cfg": {"model": args, "task": {"_name": "translation"}}, "model": weights,
                     "optimizer_history": [{"num_updates": 7}], "extra_state": {}}, folder / name)


def corpus(folder: Path, broken: str = "") -> None:
    """Multi30k-named raw files (train/val/test_2016_flickr .de/.en), then one defect."""
    rng = random.Random(0)
    for split, n in (("train", 200), ("val", 20), ("test_2016_flickr", 20)):
        for lang, letter in (("de", "w"), ("en", "v")):
            lines = [" ".join(f"{letter}{rng.randrange(30)}" for _ in range(rng.randint(2, 8))) for _ in range(n)]
            write(folder, f"raw/{split}.{lang}", "\n".join(lines) + "\n")
    train = folder / "raw/train.de"
    if broken == "empty":
        train.write_text("")
        (folder / "raw/train.en").write_text("")
    elif broken == "mismatched":
        lines = (folder / "raw/train.en").read_text().splitlines()
        (folder / "raw/train.en").write_text("\n".join(lines[:150]) + "\n")
    elif broken == "truncated":
        train.write_bytes(train.read_bytes()[:700])
    elif broken == "truncated_gz":
        import gzip

        data = gzip.compress(train.read_bytes())
        train.unlink()
        (folder / "raw/train.de.gz").write_bytes(data[: len(data) // 2])
    elif broken == "latin1":
        train.write_bytes(train.read_bytes() + "caf\u00e9 au lait\n".encode("latin-1"))
        with open(folder / "raw/train.en", "a") as f:
            f.write("coffee\n")


def fake_data_bin(folder: Path, name: str = "bin", splits=("train", "valid", "test")) -> None:
    """File names of a fairseq-preprocess data-bin (contents are not read before training)."""
    write(folder, f"{name}/dict.src.txt", "w1 1\n")
    write(folder, f"{name}/dict.tgt.txt", "v1 1\n")
    for split in splits:
        for lang in ("src", "tgt"):
            for ext in ("idx", "bin"):
                write(folder, f"{name}/{split}.src-tgt.{lang}.{ext}", "")


EXPERIMENT = """\
    name: bad
    train: {{args: --optimizer adam --lr 1e-3 --max-tokens 500, max_update: 10}}
    eval: {{subsets: [test]}}
    rows:
      - {{id: sret, arch: sret_transformer_tiny}}
    {extra}"""


def experiment(folder: Path, text: str = "", name: str = "exp.yaml", data: bool = True) -> None:
    write(folder, name, text if text.startswith("name") else textwrap.dedent(EXPERIMENT).format(extra=text))
    if data:
        fake_data_bin(folder)


def exp_case(id_, what, text, message, data_arg="bin", extra_args=()):
    return Case(id_, what, ["sret-experiments", "exp.yaml", "--data", data_arg, "--results", "results",
                            "--output", "runs", *extra_args], message,
                setup=lambda folder: experiment(folder, text))


def images(folder: Path) -> None:
    """Two classes of four 32x32 images in train/ and val/."""
    from PIL import Image

    for split in ("train", "val"):
        for label in ("a", "b"):
            (folder / "images" / split / label).mkdir(parents=True, exist_ok=True)
            for i in range(4):
                Image.new("RGB", (32, 32), (i * 40, 0, 0) if label == "a" else (0, i * 40, 0)).save(
                    folder / "images" / split / label / f"{i}.png")


def linked_images(folder: Path, link: str, target: str) -> None:
    """:func:`images` with a symbolic link ``link`` (under images/train) to ``target``."""
    images(folder)
    os.symlink(target, folder / "images" / "train" / link)


def vision_checkpoint(folder: Path, name: str = "sret_ext.pt", model: str = "sret_ext", **extra) -> None:
    """Weights as sret-train-vision saves them (2 classes, 32x32)."""
    from fairseq_sret.vision import create_model
    from fairseq_sret.vision.weights import save_checkpoint

    save_checkpoint(create_model(model, num_classes=2, img_size=32), folder / name,
                    {"model_name": model, "model_kwargs": {"num_classes": 2, "img_size": 32}, **extra})


def vision_run(folder: Path, epochs_done: int = 1) -> None:
    """images/ and out/ holding a run of sret-train-vision after ``epochs_done`` epochs."""
    import torch

    from fairseq_sret.vision import create_model
    from fairseq_sret.vision.weights import save_checkpoint
    from fairseq_sret_cli.vision_trainer.schedules import param_groups

    images(folder)
    (folder / "out").mkdir()
    model = create_model("sret_ext", num_classes=2, img_size=32)
    extra = {"model_name": "sret_ext", "model_kwargs": {"num_classes": 2, "img_size": 32},
             "epoch": epochs_done - 1, "best_acc1": 50.0}
    save_checkpoint(model, folder / "out/checkpoint_best.pt", extra)
    save_checkpoint(model, folder / "out/checkpoint_last.pt", dict(
        extra, optimizer=torch.optim.AdamW(param_groups(model, 0.05)).state_dict(),
        scaler=torch.amp.GradScaler("cpu", enabled=False).state_dict()))
    write(folder, "out/log.jsonl", "".join(f'{{"epoch": {e}}}\n' for e in range(epochs_done)))


VISION = ["--data", "images", "--model", "sret_ext", "--img-size", "32", "--batch-size", "4", "--workers", "0",
          "--epochs", "1", "--warmup-epochs", "0", "--log-interval", "0"]


def vision(*args):
    return ["sret-train-vision", *VISION, *args]


def experiment_run(folder: Path, row: str = "  - {id: sret, arch: sret_transformer_tiny, args: --lr 1e-3}\n",
                   header: str = "name: bound\ntrain: {args: --optimizer adam --max-tokens 500, max_update: 10}\n"
                                 "eval: {subsets: [test]}\nrows:\n") -> Path:
    """exp.yaml, a data-bin of empty files, and runs/ holding the run sret/seed1 as the runner
    leaves it after training with ``row`` (its run.json and a checkpoint)."""
    import json

    import yaml

    from fairseq_sret_cli.experiment_runner import parse_experiment
    from fairseq_sret_cli.experiment_runner.commands import train_command
    from fairseq_sret_cli.experiment_runner.run_folder import run_paths
    from fairseq_sret_cli.experiment_runner.settings import run_settings, settings_fingerprint

    write(folder, "exp.yaml", header + row)
    fake_data_bin(folder)
    exp = parse_experiment(yaml.safe_load((folder / "exp.yaml").read_text()), folder / "exp.yaml")
    run = exp.runs()[0]
    paths = run_paths(folder / "runs", run)
    settings = run_settings(exp, run, str(folder / "bin"), folder / "runs", False, None, None, None)
    write(paths.checkpoints, "checkpoint_last.pt", "weights")
    write(paths.root, "train.log", "log")
    write(paths.root, "run.json", json.dumps({"status": "training", "command": train_command(exp, run, "bin", paths)[1:],
                                               "train_settings": settings,
                                               "train_fingerprint": settings_fingerprint(settings)}))
    return paths.root


GENERATED = "".join(f"S-{i}\tw{i} w2\nT-{i}\tv2 v{i}\nH-{i}\t-0.5\tv2 v{i}\n" for i in range(3)) + \
    "Generate test with beam=2: BLEU4 = 100.00\n"


def scored(folder: Path) -> None:
    """A data-bin, two fairseq-generate outputs of it, and eval/ holding the first one's scores."""
    from fairseq_sret_cli.evaluate import main as evaluate

    fake_data_bin(folder, splits=("test",))
    write(folder, "gen/generate-test.txt", GENERATED)
    write(folder, "gen/other.txt", GENERATED.replace("-0.5", "-0.7"))
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        evaluate(["--data", str(folder / "bin"), "--generate-output", str(folder / "gen/generate-test.txt"),
                  "--output-dir", str(folder / "eval")])


def three_classes(folder: Path) -> None:
    """SReT-ExT weights for 3 classes as a bare state dict (no model name to go by)."""
    import torch

    from fairseq_sret.vision import create_model

    torch.save(create_model("sret_ext", num_classes=3, img_size=32).state_dict(), folder / "three.pt")


def _training_options():
    sys.path.insert(0, str(REPO / "tests"))
    from cli_helpers import SRET, TRAIN

    return [*SRET, *TRAIN]


#: fairseq-train options of a tiny SReT (cli_helpers.SRET + TRAIN)
SRET_TRAIN = _training_options()


# ---------------------------------------------------------------- the cases
def uptrain(*args):
    return ["sret-uptrain", *args]


CASES: List[Case] = [
    # sret-uptrain
    Case("uptrain-missing-input", "a checkpoint path that does not exist",
         uptrain("nope.pt", "out.pt"), "nope.pt: no such checkpoint file"),
    Case("uptrain-recursions-0", "`--recursions 0`", uptrain("transformer.pt", "out.pt", "--recursions", "0"),
         "--recursions must be at least 1", setup=transformer_checkpoint),
    Case("uptrain-output-is-input", "the output path equal to the input",
         uptrain("transformer.pt", "./transformer.pt"), "transformer.pt: an input of this command", setup=transformer_checkpoint),
    Case("uptrain-output-is-input-force", "the output path equal to the input, with `--force`",
         uptrain("transformer.pt", "transformer.pt", "--force"), "transformer.pt: an input of this command",
         setup=transformer_checkpoint),
    Case("uptrain-output-exists", "an output path that exists",
         uptrain("transformer.pt", "out.pt"), "out.pt: exists, not made by sret-uptrain; choose another output, or pass --force",
         setup=lambda f: (transformer_checkpoint(f), write(f, "out.pt", "precious"))),
    Case("uptrain-output-folder", "an output path that is a folder",
         uptrain("transformer.pt", "out"), "out: a folder (give the path of a file)",
         setup=lambda f: (transformer_checkpoint(f), (f / "out").mkdir())),
    Case("uptrain-not-transformer", "a checkpoint of another architecture (sret_transformer)",
         uptrain("sret.pt", "out.pt"), "uptraining converts fairseq 'transformer' checkpoints",
         setup=lambda f: transformer_checkpoint(f, "sret.pt", layers=2, arch="sret_transformer_tiny")),
    Case("uptrain-not-a-checkpoint", "a text file given as the checkpoint",
         uptrain("notes.pt", "out.pt"), "not a torch checkpoint", setup=lambda f: write(f, "notes.pt", "hello\n")),
    Case("uptrain-mismatched-dims", "a checkpoint whose layer weights do not match its dimensions",
         uptrain("broken.pt", "out.pt"), "encoder layer 1, ffn.fc1.weight: the checkpoint's shape (48, 31)",
         setup=lambda f: transformer_checkpoint(f, "broken.pt", break_shape="encoder.layers.1.fc1.weight")),
    Case("uptrain-indivisible", "a layer count the recursions do not divide (4 layers, 3 recursions)",
         uptrain("transformer.pt", "out.pt", "--recursions", "3"), "4 encoder layers do not divide into 3",
         setup=transformer_checkpoint),
    Case("uptrain-data-bin-missing", "`--data-bin` a folder that does not exist",
         uptrain("transformer.pt", "out.pt", "--data-bin", "nope"), "--data-bin nope: no such folder",
         setup=transformer_checkpoint),
    Case("uptrain-data-bin-other-size", "`--data-bin` whose dictionary has another size than the embeddings",
         uptrain("transformer.pt", "out.pt", "--data-bin", "bin"), "symbols, but the checkpoint's encoder embeddings",
         setup=lambda f: (transformer_checkpoint(f), fake_data_bin(f))),
    # sret-experiments
    Case("experiments-missing-file", "an experiment file that does not exist",
         ["sret-experiments", "nope.yaml", "--data", "bin"], "nope.yaml: no such experiment file"),
    exp_case("experiments-unknown-key", "an experiment file with an unknown key (`epochs:`)",
             "epochs: 3", "unknown fields ['epochs']"),
    exp_case("experiments-wrong-type", "a wrong type (`eval.lenpen: high`)",
             "name: bad\ntrain: {args: --lr 1, max_update: 10}\neval: {lenpen: high}\n"
             "rows:\n  - {id: a, arch: transformer}\n", "eval.lenpen must be a number"),
    exp_case("experiments-nan", "a length penalty that is not a number (`eval.lenpen: .nan`)",
             "name: bad\ntrain: {args: --lr 1, max_update: 10}\neval: {lenpen: .nan}\n"
             "rows:\n  - {id: a, arch: transformer}\n", "eval.lenpen must be finite, got nan"),
    exp_case("experiments-last0", "an average of no checkpoint (`eval.checkpoints: [last0]`)",
             "name: bad\ntrain: {args: --lr 1, max_update: 10}\neval: {checkpoints: [last0]}\n"
             "rows:\n  - {id: a, arch: transformer}\n", "'last0' averages no checkpoint"),
    Case("experiments-seed-twice", "`sret-experiments --seeds 1 1`",
         ["sret-experiments", "exp.yaml", "--data", "bin", "--seeds", "1", "1"], "--seeds names [1] more than once"),
    exp_case("experiments-string-for-list", "a string where a list belongs (`eval.checkpoints: best`)",
             "name: bad\ntrain: {args: --lr 1, max_update: 10}\neval: {checkpoints: best}\n"
             "rows:\n  - {id: a, arch: transformer}\n", "eval.checkpoints must be a non-empty list"),
    exp_case("experiments-duplicate-rows", "duplicate row names",
             "  - {id: sret, arch: transformer}", "row ids repeat: ['sret']"),
    exp_case("experiments-duplicate-key", "a key given twice in one mapping (two `rows:`)",
             "rows:\n  - {id: other, arch: transformer}", "key 'rows' appears twice"),
    exp_case("experiments-no-data", "a data path that does not exist",
             "", "data-bin nope does not exist", data_arg="nope"),
    exp_case("experiments-no-data-dry-run", "a data path that does not exist, with `--dry-run`",
             "", "data-bin nope does not exist", data_arg="nope", extra_args=["--dry-run"]),
    exp_case("experiments-subset-missing", "an evaluation subset the data-bin lacks (`test1`)",
             "name: bad\ntrain: {args: --lr 1, max_update: 10}\neval: {subsets: [test, test1]}\n"
             "rows:\n  - {id: a, arch: transformer}\n", "eval.subsets ['test1'] are not in the data-bin"),
    Case("experiments-not-a-data-bin", "a folder that is not a data-bin",
         ["sret-experiments", "exp.yaml", "--data", "raw"], "raw is not a fairseq data-bin",
         setup=lambda f: (experiment(f, data=False), write(f, "raw/train.de", "hallo\n"))),
    Case("experiments-truncated-results", "a results file cut short (an interrupted write by an older version)",
         ["sret-experiments", "exp.yaml", "--data", "bin", "--results", "results", "--output", "runs"],
         "bad.json is not valid JSON",
         setup=lambda f: (experiment(f), write(f, "results/bad.json", '{"runs": [{"row": "sret", "st'))),
    # sret-prepare
    *[Case(f"prepare-{kind}", what, ["sret-prepare", "multi30k", "--src", "raw", "--out", "data-bin",
                                      "--vocab-size", "60"], message,
           setup=lambda f, kind=kind: corpus(f, kind))
      for kind, what, message in [
          ("empty", "empty training files", "train: no text"),
          ("mismatched", "source and target of different lengths (200 and 150 lines)",
           "train: source has 200 lines, target 150"),
          ("truncated", "a training file cut short mid-line", "train: source has"),
          ("truncated_gz", "a truncated `.gz` training file", "train.de.gz: damaged or truncated gzip file"),
          ("latin1", "a Latin-1 (not UTF-8) training file", "raw/train.de: not UTF-8 text (line 201"),
      ]],
    Case("prepare-missing-src", "a `--src` folder that does not exist",
         ["sret-prepare", "multi30k", "--src", "nope", "--out", "data-bin"], "nope does not exist"),
    # the other commands
    Case("evaluate-missing-data", "`sret-evaluate` with a data-bin that does not exist",
         ["sret-evaluate", "--data", "nope", "--checkpoint", "c.pt"], "data-bin nope does not exist",
         setup=lambda f: write(f, "c.pt", "x")),
    Case("evaluate-missing-checkpoint-dir", "`sret-evaluate --checkpoint-dir` of a folder with no checkpoints",
         ["sret-evaluate", "--data", "bin", "--checkpoint-dir", "run", "--average-last", "2"], "run",
         setup=lambda f: (fake_data_bin(f), (f / "run").mkdir())),
    Case("average-no-checkpoints", "`sret-average-checkpoints` on a folder with no checkpoints",
         ["sret-average-checkpoints", "--inputs", "run", "--num-epoch-checkpoints", "2", "--output", "avg.pt"],
         "run", setup=lambda f: (f / "run").mkdir()),
    Case("train-vision-missing-data", "`sret-train-vision` with a data folder that does not exist",
         ["sret-train-vision", "--data", "nope", "--model", "sret_t", "--epochs", "1", "--output", "out"],
         "no training split"),
    Case("train-vision-missing-resume", "`sret-train-vision --resume` of a file that does not exist",
         ["sret-train-vision", "--data", "images", "--model", "sret_ext", "--img-size", "32", "--epochs", "1",
          "--resume", "nope.pt", "--output", "out"], "nope.pt", setup=lambda f: images(f)),
    Case("toy-data-onto-a-file", "`sret-toy-data` onto a path that is a file",
         ["sret-toy-data", "taken"], "taken", setup=lambda f: write(f, "taken", "mine\n")),
    # outputs in the way, inputs as outputs: the output rule (fairseq_sret_cli/outputs.py)
    Case("toy-data-over-user-files", "`sret-toy-data` into a folder holding the user's own `train.src`",
         ["sret-toy-data", "corpus"], "corpus/train.src: exists, not made by sret-toy-data",
         setup=lambda f: write(f, "corpus/train.src", "my sentences\n")),
    Case("prepare-over-user-files", "`sret-prepare --out` a folder holding files of a data-bin's names",
         ["sret-prepare", "multi30k", "--src", "raw", "--out", "project", "--vocab-size", "60"],
         "project/dict.de.txt: exists, not made by sret-prepare",
         setup=lambda f: (corpus(f), write(f, "project/dict.de.txt", "my dictionary\n"))),
    Case("prepare-over-user-work-dir", "`sret-prepare --src` an archive, `--out` a folder whose `orig/` (the"
         " download folder) is the user's", ["sret-prepare", "multi30k", "--src", "raw.tgz", "--out", "project"],
         "project/orig: exists, not made by sret-prepare; give another --work-dir, or pass --force",
         setup=lambda f: (write(f, "raw.tgz", "not an archive\n"), write(f, "project/orig/notes.txt", "mine\n"))),
    Case("prepare-vocab-size-0", "`sret-prepare --vocab-size 0`",
         ["sret-prepare", "multi30k", "--src", "raw", "--vocab-size", "0"], "--vocab-size: must be at least 2, got 0"),
    Case("prepare-workers-0", "`sret-prepare --workers 0`",
         ["sret-prepare", "multi30k", "--src", "raw", "--workers", "0"], "--workers: must be at least 1, got 0"),
    Case("average-output-is-input", "`sret-average-checkpoints --output` one of its inputs",
         ["sret-average-checkpoints", "--inputs", "run", "--num-epoch-checkpoints", "2", "--output",
          "run/checkpoint2.pt", "--force"], "run/checkpoint2.pt: an input of this command",
         setup=lambda f: (transformer_checkpoint(f / "run", "checkpoint1.pt"),
                          transformer_checkpoint(f / "run", "checkpoint2.pt"))),
    Case("average-output-is-best", "`sret-average-checkpoints --output` the run's `checkpoint_best.pt`",
         ["sret-average-checkpoints", "--inputs", "run", "--num-epoch-checkpoints", "2", "--output",
          "run/checkpoint_best.pt"], "run/checkpoint_best.pt: exists, not made by sret-average-checkpoints",
         setup=lambda f: [transformer_checkpoint(f / "run", name)
                          for name in ("checkpoint1.pt", "checkpoint2.pt", "checkpoint_best.pt")]),
    Case("average-same-file-twice", "`sret-average-checkpoints --inputs a.pt ./a.pt` (one checkpoint twice)",
         ["sret-average-checkpoints", "--inputs", "a.pt", "./a.pt", "--output", "avg.pt"],
         "a.pt: given twice; each checkpoint counts once in the average", setup=lambda f: transformer_checkpoint(f, "a.pt")),
    Case("average-negative", "`sret-average-checkpoints --num-epoch-checkpoints -2`",
         ["sret-average-checkpoints", "--inputs", "run", "--num-epoch-checkpoints", "-2", "--output", "avg.pt"],
         "--num-epoch-checkpoints: must be at least 1, got -2"),
    Case("average-unwritable", "`sret-average-checkpoints --output` in `/proc`",
         ["sret-average-checkpoints", "--inputs", "a.pt", "--output", "/proc/avg.pt"], "/proc/avg.pt",
         setup=lambda f: transformer_checkpoint(f, "a.pt")),
    Case("uptrain-nll-ratio-negative", "`sret-uptrain --nll-ratio -1`",
         uptrain("transformer.pt", "out.pt", "--nll-ratio", "-1"), "--nll-ratio: must be at least 0.0, got -1",
         setup=transformer_checkpoint),
    Case("evaluate-again-other-settings", "`sret-evaluate` of another output into a folder holding an evaluation",
         ["sret-evaluate", "--data", "bin", "--generate-output", "gen/other.txt", "--output-dir", "eval"],
         "eval/test.hyp and 1 more: made by sret-evaluate with other settings (generate_output=", setup=scored),
    Case("evaluate-generate-args-beam", "`sret-evaluate --generate-args '--beam 1'` (the report would say beam 5)",
         ["sret-evaluate", "--data", "bin", "--checkpoint", "c.pt", "--generate-args", "--beam 1"],
         "--generate-args: --beam is set by sret-evaluate itself: give --beam"),
    Case("evaluate-generate-args-path", "`sret-evaluate --generate-args=--pa=other.pt` (another model, scored under this one's name)",
         ["sret-evaluate", "--data", "bin", "--checkpoint", "c.pt", "--generate-args=--pa=other.pt"],
         "--generate-args: --pa=other.pt (that is --path) is set by sret-evaluate itself: give --checkpoint"),
    Case("evaluate-beam-0", "`sret-evaluate --beam 0`",
         ["sret-evaluate", "--data", "bin", "--checkpoint", "c.pt", "--beam", "0"], "--beam: must be at least 1, got 0"),
    Case("evaluate-lenpen-nan", "`sret-evaluate --lenpen nan`",
         ["sret-evaluate", "--data", "bin", "--checkpoint", "c.pt", "--lenpen", "nan"],
         "--lenpen: must be a finite number, got nan"),
    Case("evaluate-average-negative", "`sret-evaluate --average-last -3`",
         ["sret-evaluate", "--data", "bin", "--checkpoint-dir", "run", "--average-last", "-3"],
         "--average-last: must be at least 1, got -3"),
    Case("evaluate-empty-output", "`sret-evaluate --generate-output` of an empty file",
         ["sret-evaluate", "--data", "bin", "--generate-output", "empty.txt"], "empty.txt holds no hypotheses",
         setup=lambda f: (fake_data_bin(f), write(f, "empty.txt", ""))),
    Case("evaluate-output-other-beam", "`sret-evaluate --generate-output` decoded with beam 2, given `--beam 4`",
         ["sret-evaluate", "--data", "bin", "--generate-output", "gen/generate-test.txt", "--beam", "4"],
         "was decoded with beam 2, not --beam 4", setup=scored),
    Case("evaluate-output-other-subset", "`sret-evaluate --generate-output` of `test` scored as `--subset valid`",
         ["sret-evaluate", "--data", "bin", "--generate-output", "gen/generate-test.txt", "--subset", "valid"],
         "translates the subset 'test', not 'valid': pass --subset test",
         setup=lambda f: (scored(f), fake_data_bin(f, splits=("valid", "test")))),
    Case("count-img-size-0", "`sret-count vision --img-size 0`", ["sret-count", "vision", "sret_t", "--img-size", "0"],
         "--img-size: must be at least 1, got 0"),
    Case("count-bad-groups", "`sret-count vision --groups 8,x`", ["sret-count", "vision", "sret_t", "--groups", "8,x"],
         "--groups: groups must look like 8,2 4,1 1,1"),
    Case("experiments-jobs-0", "`sret-experiments --jobs 0`", ["sret-experiments", "exp.yaml", "--jobs", "0"],
         "--jobs: must be at least 1, got 0"),
    Case("experiments-negative-counts", "`sret-experiments --seeds -1`",
         ["sret-experiments", "exp.yaml", "--seeds", "-1"], "--seeds: must be at least 0, got -1"),
    Case("experiments-max-update-negative", "`sret-experiments --max-update -5`",
         ["sret-experiments", "exp.yaml", "--max-update", "-5"], "--max-update: must be at least 1, got -5"),
    Case("experiments-edited-row", "an experiment row edited (its `--lr`) after its run was trained",
         ["sret-experiments", "exp.yaml", "--data", "bin", "--output", "runs", "--results", "results"],
         "sret/seed1 was trained in runs/sret/seed1 with other settings (--lr 1e-3 -> 5e-4)",
         setup=lambda f: (experiment_run(f), write(f, "exp.yaml", (f / "exp.yaml").read_text().replace("1e-3", "5e-4"))),
         kept=["runs/.sret-lock"]),
    Case("experiments-foreign-checkpoints", "an output folder whose run folder holds checkpoints it did not record",
         ["sret-experiments", "exp.yaml", "--data", "bin", "--output", "runs", "--results", "results"],
         "holds checkpoints that sret-experiments did not record (no run.json)",
         setup=lambda f: (experiment(f), write(f, "runs/sret/seed1/checkpoints/checkpoint_last.pt", "weights")),
         kept=["runs/.sret-lock"]),
    Case("experiments-foreign-results", "a results folder holding the user's own `NAME.md`",
         ["sret-experiments", "exp.yaml", "--data", "bin", "--output", "runs", "--results", "results"],
         "results/bad.md: exists, not made by sret-experiments",
         setup=lambda f: (experiment(f), write(f, "results/bad.md", "my notes\n"))),
    # sret-train-vision
    Case("train-vision-no-output", "`sret-train-vision` training without `--output`", vision(),
         "--output DIR is required to train"),
    Case("train-vision-epochs-0", "`sret-train-vision --epochs 0`", vision("--output", "out", "--epochs", "0"),
         "--epochs: must be at least 1, got 0"),
    Case("train-vision-lr-inf", "`sret-train-vision --lr inf`", vision("--output", "out", "--lr", "inf"),
         "--lr: must be a finite number, got inf"),
    Case("train-vision-label-smoothing-2", "`sret-train-vision --label-smoothing 2`",
         vision("--output", "out", "--label-smoothing", "2"), "--label-smoothing: must be in [0.0, 1.0), got 2"),
    Case("train-vision-second-run", "a second `sret-train-vision` into the `--output` of a trained run",
         vision("--output", "out"), "out holds a run (checkpoint_best.pt, checkpoint_last.pt, log.jsonl): continue it"
         " with --resume out/checkpoint_last.pt", setup=vision_run),
    Case("train-vision-resume-past-epochs", "`--resume` of a run that trained every epoch of `--epochs`",
         vision("--output", "out", "--resume", "out/checkpoint_last.pt"),
         "has trained 1 epochs, all of the 1 asked for: nothing to train", setup=vision_run),
    Case("train-vision-output-is-a-file", "`sret-train-vision --output` a file", vision("--output", "notes.txt"),
         "notes.txt: a file, not a folder", setup=lambda f: (images(f), write(f, "notes.txt", "mine\n"))),
    Case("train-vision-dump-onto-checkpoint", "`--dump-logits` the `--checkpoint` it reads",
         vision("--checkpoint", "sret_ext.pt", "--dump-logits", "sret_ext.pt", "--force"),
         "sret_ext.pt: an input of this command", setup=lambda f: (images(f), vision_checkpoint(f))),
    Case("train-vision-other-model", "`--checkpoint` of another model (sret_t weights for `--model sret_ext`)",
         vision("--eval-only", "--checkpoint", "sret_t.pt"), "sret_t.pt holds a sret_t model",
         setup=lambda f: (images(f), vision_checkpoint(f, "sret_t.pt", "sret_t"))),
    Case("train-vision-other-size", "`--checkpoint` of the same model built for 3 classes (a bare state dict)",
         vision("--eval-only", "--checkpoint", "three.pt"), "three.pt: the checkpoint's weights do not fit this SReT:"
         " 2 of another shape (e.g. head.weight: [3, 256] in the checkpoint",
         setup=lambda f: (images(f), three_classes(f))),
    Case("train-vision-text-checkpoint", "a text file as `--checkpoint`", vision("--eval-only", "--checkpoint", "notes.pt"),
         "not a torch checkpoint", setup=lambda f: (images(f), write(f, "notes.pt", "hello\n"))),
    Case("train-vision-random-checkpoint", "random bytes as `--checkpoint`",
         vision("--eval-only", "--checkpoint", "noise.pt"), "noise.pt is truncated or corrupted",
         setup=lambda f: (images(f), (f / "noise.pt").write_bytes(random.Random(0).randbytes(4096)))),
    Case("train-vision-cuda", "`sret-train-vision --device cuda` on a machine without CUDA",
         vision("--output", "out", "--device", "cuda"), "--device cuda: CUDA is not available", setup=images),
    Case("train-vision-nan-loss", "`sret-train-vision --lr 1e30` (the loss becomes NaN)",
         vision("--output", "out", "--lr", "1e30"), "loss is nan at epoch 0 step 1: training diverged; lower --lr",
         setup=images, kept=["out"]),
    Case("train-vision-link-loop", "an image folder with a symbolic link back to its own split",
         vision("--output", "out"), "images/train/a/loop leads to images/train (a link loop)",
         setup=lambda f: linked_images(f, "a/loop", "..")),
    Case("train-vision-sibling-link", "a class folder with a link into another class's folder",
         vision("--output", "out"), "images/train/a/more leads to images/train/b (a second path to images of class 'b')",
         setup=lambda f: linked_images(f, "a/more", "../b")),
    # fairseq's commands with our plugin (a trained tiny SReT, the e2e tier)
    *[Case(f"overrides-{name}", f"`--model-overrides \"{override}\"`",
           ["fairseq-generate", "bin", "--user-dir", str(REPO / "fairseq_sret"), "--path", "ckpt/checkpoint_last.pt",
            "--gen-subset", "test", "--beam", "2", "--cpu", "--model-overrides", override], message,
           style="fairseq", needs_model=True)
      for name, override, message in [
          ("depth-0", "{'encoder_recursions': 0}", "--encoder-recursions must be an integer >= 1, got 0"),
          ("depth-negative", "{'decoder_recursions': -1}", "--decoder-recursions must be an integer >= 1, got -1"),
          ("depth-string", "{'encoder_recursions': 'two'}", "--encoder-recursions must be an integer >= 1, got 'two'"),
          ("depth-above-trained", "{'encoder_recursions': 3}",
           "--encoder-recursions=3 is larger than the 2 recursions this model was trained with"),
          ("embed-dim", "{'encoder_embed_dim': 64}", "--encoder-embed-dim (64) must equal --decoder-embed-dim (32)"),
          ("layers", "{'encoder_layers': 3}", "weights do not fit the model its configuration (with any"
           " --model-overrides) builds: 32 missing"),
          ("ffn-dim", "{'decoder_ffn_embed_dim': 128}", "6 of another shape (e.g. decoder.layers.0.recursive.layer"
           ".ffn.fc1.weight: [64, 32] in the checkpoint, [128, 32] in the model)"),
      ]],
    Case("dictionary-mismatch", "a data-bin whose dictionary does not match the checkpoint's",
         ["fairseq-generate", "other-bin", "--user-dir", str(REPO / "fairseq_sret"), "--path",
          "ckpt/checkpoint_last.pt", "--gen-subset", "test", "--beam", "2", "--cpu"],
         "the data-bin's source dictionary", style="fairseq", needs_model=True),
    Case("evaluate-dictionary-mismatch", "`sret-evaluate` with a data-bin whose dictionary does not match",
         ["sret-evaluate", "--data", "other-bin", "--checkpoint", "ckpt/checkpoint_last.pt", "--cpu",
          "--output-dir", "ckpt/eval"], "is not the one the model was trained with", needs_model=True,
         kept=["ckpt/eval"]),
    *[Case(f"generate-{name}", what,
           ["fairseq-generate", "bin", "--user-dir", str(REPO / "fairseq_sret"), "--path", path,
            "--gen-subset", "test", "--beam", "2", "--cpu", *flags], message, style="fairseq", needs_model=True,
           setup=setup)
      for name, what, flags, path, message, setup in [
          ("misspelt-override", "a misspelt override: `--model-overrides \"{'encoder_recursion': 1}\"`",
           ["--model-overrides", "{'encoder_recursion': 1}"], "ckpt/checkpoint_last.pt",
           "no option is called 'encoder_recursion' (did you mean 'encoder_recursions'", Case.setup),
          ("vision-checkpoint", "an image model's checkpoint (of sret-train-vision) as `--path`", [], "sret_ext.pt",
           "sret_ext.pt is not a checkpoint of fairseq-train (an image model's checkpoint (sret_ext", vision_checkpoint),
      ]],
    Case("train-resume-other-dictionary", "`fairseq-train` resuming a checkpoint on a data-bin with another dictionary",
         ["fairseq-train", "other-bin", *SRET_TRAIN, "--max-update", "5", "--save-dir", "ckpt"],
         "cannot load the model parameters of ckpt/checkpoint_last.pt: the data-bin's source dictionary",
         style="fairseq", needs_model=True),
    Case("finetune-other-dictionary", "`fairseq-train --finetune-from-model` on a data-bin with another dictionary",
         ["fairseq-train", "other-bin", *SRET_TRAIN, "--max-update", "5", "--save-dir", "finetuned",
          "--finetune-from-model", "ckpt/checkpoint_last.pt"],
         "cannot load the model parameters of ckpt/checkpoint_last.pt: the data-bin's source dictionary",
         style="fairseq", needs_model=True, kept=["finetuned"]),
    Case("train-mixed-depth-too-deep", "`fairseq-train --mixed-depth 3` for a model of 2 recursions",
         ["fairseq-train", "bin", *SRET_TRAIN, "--max-update", "5", "--save-dir", "md", "--criterion",
          "sret_mixed_depth_label_smoothed_cross_entropy", "--mixed-depth", "3"],
         "--mixed-depth: depth=3 is larger than the 2 recursions the encoder was built with", style="fairseq",
         needs_model=True, kept=["md"]),
    Case("hydra-misspelt-field", "a YAML config with a misspelt SReT field (`encoder_recursion`)",
         ["fairseq-hydra-train", "--config-dir", "config", "--config-name", "toy", "+model.encoder_recursion=2"],
         "unrecognized model option model.encoder_recursion", style="fairseq", needs_model=True,
         kept=["hydra-ckpt"]),  # hydra's own log of the run
]


# ---------------------------------------------------------------- the shared model (e2e cases)
HYDRA_CONFIG = """\
common: {{user_dir: {user_dir}, cpu: true, log_format: simple}}
task: {{_name: translation, data: {data}}}
model: {{_name: sret_transformer_tiny, encoder_embed_dim: 32, decoder_embed_dim: 32,
        encoder_ffn_embed_dim: 64, decoder_ffn_embed_dim: 64, share_all_embeddings: true}}
criterion: {{_name: label_smoothed_cross_entropy, label_smoothing: 0.1}}
optimization: {{max_update: 2, lr: [0.001]}}
optimizer: {{_name: adam}}
lr_scheduler: {{_name: fixed}}
dataset: {{max_tokens: 400, num_workers: 0}}
checkpoint: {{save_dir: hydra-ckpt}}
hydra: {{run: {{dir: hydra-ckpt}}, output_subdir: null}}
"""


def make_model_folder(folder: Path) -> None:
    """A toy data-bin, a tiny SReT trained on it for 3 updates, a data-bin with another
    dictionary and a hydra config: what the fairseq-side cases share."""
    sys.path.insert(0, str(REPO / "tests"))
    from cli_helpers import SRET, TRAIN, preprocess, run, write_corpus

    raw = write_corpus(folder / "raw")
    os.replace(preprocess(raw), folder / "bin")
    other = write_corpus(folder / "raw-other", seed=1)
    for path in other.iterdir():  # other words: another dictionary
        path.write_text(path.read_text().replace("w", "x").replace("v", "y"))
    os.replace(preprocess(other), folder / "other-bin")
    run("fairseq-train", folder / "bin", *SRET, *TRAIN, "--max-update", "3", "--save-dir", folder / "ckpt")
    write(folder, "config/toy.yaml", HYDRA_CONFIG.format(user_dir=REPO / "fairseq_sret", data=folder / "bin"))


# ---------------------------------------------------------------- running a case
def snapshot(folder: Path) -> Dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()[:16] if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def changes(before: Dict[str, str], after: Dict[str, str]) -> List[str]:
    """What a command added, changed or removed, as ``+path``, ``~path``, ``-path``."""
    return ([f"+{p}" for p in after if p not in before] + [f"~{p}" for p in after if p in before and after[p] != before[p]]
            + [f"-{p}" for p in before if p not in after])


def run_case(case: Case, folder: Path, timeout: int = 300):
    """Run ``case`` as a user does (the installed command) in ``folder``; returns
    ``(returncode, stderr, changes)``."""
    before = snapshot(folder)
    result = subprocess.run([str(BIN / case.argv[0]), *case.argv[1:]], cwd=folder, env=ENV, capture_output=True,
                            text=True, timeout=timeout)
    return result.returncode, result.stderr, changes(before, snapshot(folder))


#: the module whose ``main`` each ``sret-*`` command runs (setup.py's entry points)
MAINS = {
    "sret-uptrain": "fairseq_sret_cli.uptrain", "sret-experiments": "fairseq_sret_cli.experiments",
    "sret-prepare": "fairseq_sret_cli.prepare", "sret-evaluate": "fairseq_sret_cli.evaluate",
    "sret-average-checkpoints": "fairseq_sret_cli.average_checkpoints",
    "sret-train-vision": "fairseq_sret_cli.train_vision", "sret-toy-data": "fairseq_sret_cli.toy",
    "sret-count": "fairseq_sret_cli.count", "sret-plot-lrc": "fairseq_sret_cli.plot_lrc",
    "sret-export-hf": "fairseq_sret_cli.export_hf",
}


def run_case_here(case: Case, folder: Path):
    """Run an ``sret-*`` case's ``main`` in this process (what its entry point calls) in
    ``folder``; returns ``(returncode, stderr, changes)``."""
    import contextlib
    import importlib
    import io

    import torch

    before, cwd, err = snapshot(folder), os.getcwd(), io.StringIO()
    threads = torch.get_num_threads()  # a command may set its own (sret-count); this process keeps its
    os.chdir(folder)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = importlib.import_module(MAINS[case.command]).main(case.argv[1:])
            except SystemExit as exc:  # argparse's usage errors
                rc = exc.code
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    return rc, err.getvalue(), changes(before, snapshot(folder))


def run_here(folder: Path, *argv: str):
    """Run the ``sret-*`` command ``argv`` in ``folder`` as its entry point does; returns
    ``(exit status, stderr, what it changed)``."""
    return run_case_here(Case("trial", "", list(argv), ""), folder)


def one_line(stderr: str, command: str) -> str:
    """The one error line ``command`` must end with (no traceback before it)."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in stderr and lines and lines[-1].startswith(f"{command}: error: "), stderr[-2000:]
    return lines[-1]


def error_line(case: Case, stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def table(rows) -> str:
    out = ["| command | input | exit | error (last line of stderr) | left on disk |", "|---|---|---|---|---|"]
    for case, rc, stderr, changed in rows:
        line = error_line(case, stderr).replace("|", "\\|")
        left = ", ".join(f"`{c}`" for c in changed) or "nothing written"
        out.append(f"| `{case.command}` | {case.input} | {rc} | {line} | {left} |")
    return "\n".join(out)


def main() -> int:
    import platform
    import tempfile

    import failure_classes

    from fairseq_sret_cli.hardware import cpu_model

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        shared = Path(tmp) / "model"
        shared.mkdir()
        make_model_folder(shared)
        for case in CASES:
            folder = Path(tmp) / case.id
            if case.needs_model:
                subprocess.run(["cp", "-r", str(shared), str(folder)], check=True)
            else:
                folder.mkdir()
            case.setup(folder)
            rc, stderr, changed = run_case_here(case, folder) if case.command in MAINS else run_case(case, folder)
            rows.append((case, rc, stderr, changed))
            print(f"{case.id}: {rc} {error_line(case, stderr)[:120]}", file=sys.stderr)
    import torch

    print(HEADER.format(machine=f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()},"
                                f" torch {torch.__version__}"))
    print(failure_classes.section())
    print()
    print("## The cases")
    print()
    print(table(rows))
    print(INTERRUPTION)
    return 0


HEADER = """# Reliability: bad input

Every input below was given to the command as a user would, in an empty folder holding only
the files the input needs; the table is the output of `python tests/bad_input_cases.py`
({machine}; the `sret-*` commands' `main` in that process, fairseq's commands as installed
programs), and each row is also a test
(`tests/cli/test_bad_input_table.py`). Our `sret-*` commands print one line, `PROG: error: ...`, and
exit non-zero (2 for a command line that cannot be carried out as given: an option out of
range, an output in the way); fairseq's commands (`fairseq-generate`, `fairseq-train`,
`fairseq-hydra-train`) keep fairseq's traceback, whose last line is shown. "Left on disk"
lists what the command added (`+`), changed (`~`) or removed (`-`) in that folder.

Every `sret-*` command that writes follows one rule (`fairseq_sret_cli/outputs.py`, described
in `docs/outputs.md`): it never replaces or deletes a file it did not make, or made with other
settings, unless `--force`; never one of its inputs, even with `--force` (links included);
and it writes each file atomically. `sret-prepare` builds the data-bin in a hidden folder inside
`--out` and moves each file in when all are made, so a failure leaves `--out` as it was
(downloads stay in `OUT/orig` for the next try); `sret-experiments` checks `--data` (also with
`--dry-run`) and every run folder's settings before training anything, and locks its output
folder. fairseq's generation and training options with our models: `tests/models/test_generation_options.py`.
`SRET_TRACEBACK=1` shows the traceback of a `sret-*` error.
"""

INTERRUPTION = """
# Reliability: interruption

`tests/cli/test_interruption.py` (e2e) kills each long-running command with SIGKILL, at random
moments and the moment a temporary checkpoint or results file appears, then resumes it:

| command | kills | checked after every kill | checked at the end |
|---|---|---|---|
| `fairseq-train` (tiny SReT, toy data, a checkpoint every 2 updates) | 20 | `checkpoint_last.pt` loads, its update count never goes back; the best checkpoint's valid loss never rises | the resumed run ends at `--max-update` (100) |
| `sret-experiments` (2 tiny rows) | up to 4 | the results JSON parses; a row recorded done stays done | every row done, trained to its `max_update` |
| `sret-train-vision --resume` (SReT-ExT at 32x32) | up to 6 | `checkpoint_last.pt` loads; the best accuracy never falls and is never below the one `checkpoint_last.pt` records | the run ends at its last epoch, each epoch logged once |

`test_ctrl_c_is_one_line_and_leaves_no_training_behind` sends Ctrl-C (SIGINT to the command
alone, as `kill -INT` does) while `sret-train-vision` and `sret-experiments` train: each prints
one line saying how to continue, exits 130 and shows no traceback; `sret-experiments` stops its
`fairseq-train` and records the training's CPU time before it exits.

Defects found in the code these tests exercise (the writes were in place, so a kill at the
wrong moment leaves a part of a file; the fixes are in place before the tests ran green):

- fairseq's `save_checkpoint` writes the first checkpoint of an update atomically, then
  *copies* it onto `checkpoint_best.pt` and `checkpoint_last.pt` in place (the patch's probe
  shows it: a hard link to the target sees the new content), so a kill during the copy leaves
  a truncated `checkpoint_last.pt` (the run cannot resume) or `checkpoint_best.pt` (the best
  model is lost). The `atomic_checkpoint_copy` patch
  (`fairseq_sret/fairseq_patches/`) copies to a temporary file and renames it.
- `sret-experiments` wrote its results JSON and markdown in place: a kill mid-write
  truncates the file that records every finished run. Both are now written to a synced
  temporary file and renamed, as the run records already were; a damaged results file is
  refused with a message instead of being replaced.
- `sret-train-vision` saved `checkpoint_last.pt` and `checkpoint_best.pt` in place (a kill
  truncates them) and appended the epoch to `log.jsonl` before saving. Now: both files atomic,
  best before last, and `--resume` takes the best accuracy of `checkpoint_best.pt` too (a kill
  between the two saves left `checkpoint_last.pt` with the older best, and a worse model could
  then have replaced the best one).
- With the log line written after both checkpoints, a kill between `checkpoint_last.pt` and
  the log line left a run whose last epoch was trained and never logged (a resume found
  nothing to train). Now the log line comes before `checkpoint_last.pt`, and `--resume` drops
  the lines of the epochs it trains again: each epoch is logged once.
"""


if __name__ == "__main__":
    sys.exit(main())
