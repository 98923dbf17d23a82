"""The image commands against what a user may try that the documentation does not forbid: rates
that make the model diverge in its last step, infinite options, damaged images and downloads,
image folders that teach nothing, options the data decides, inputs kept inside the output
folder, a ``--force`` whose ``--resume`` fails. Each command must refuse by name (one line, no
traceback) or do what was asked, and leave the user's files as they were."""

import contextlib
import io
import json
import os
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

pytest.importorskip("PIL")

from bad_input_cases import VISION, changes, images, snapshot, vision_checkpoint, vision_run  # noqa: E402
from fairseq_sret_cli import count, train_cifar, train_vision  # noqa: E402

MAINS = {"sret-train-vision": train_vision.main, "sret-train-cifar": train_cifar.main, "sret-count": count.main}
#: a few seconds of sret-train-cifar on images/ (6 training images, 2 held out)
CIFAR = ["--data-dir", "images", "--model", "sret_cifar", "--batch-size", "4", "--epochs", "1",
         "--max-steps-per-epoch", "1", "--val-split", "2", "--log-interval", "0", "--eval-batch-size", "8"]
STEP = ["--max-steps-per-epoch", "1"]


class Ran(NamedTuple):
    rc: int
    stdout: str
    stderr: str
    changed: list


def run(folder: Path, command: str, *argv: str) -> Ran:
    """Run ``command``'s ``main`` (what its entry point calls) in ``folder``."""
    before, cwd, threads = snapshot(folder), os.getcwd(), torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = MAINS[command](list(argv))
            except SystemExit as exc:  # argparse's usage errors
                rc = exc.code
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    return Ran(rc, out.getvalue(), err.getvalue(), changes(before, snapshot(folder)))


def one_line(ran: Ran, command: str) -> str:
    lines = [line for line in ran.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in ran.stderr and 'File "' not in ran.stderr, ran.stderr[-2000:]
    assert lines and lines[-1].startswith(f"{command}: error: "), ran.stderr[-2000:]
    return lines[-1]


def noise_png(path: Path, size=(32, 32)) -> None:
    from PIL import Image

    pixels = torch.randint(0, 256, (size[1], size[0], 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.numpy()).save(path)


# ---------------------------------------------------------------- a diverged model is no result
@pytest.mark.parametrize("command,argv,kept", [
    ("sret-train-vision", [*VISION, *STEP, "--output", "out", "--lr", "1e30"], []),
    ("sret-train-cifar", [*CIFAR, "--output", "out", "--lr", "1e30", "--warmup-epochs", "0"], ["out/.sret-lock"]),
])
@pytest.mark.reliability("inputs-as-they-seem")
def test_a_model_that_diverged_in_its_last_update_is_not_saved_or_scored(tmp_path, command, argv, kept):
    images(tmp_path)
    ran = run(tmp_path, command, *argv)
    assert ran.rc == 1 and "training diverged; lower --lr" in one_line(ran, command)
    assert [c for c in ran.changed if c[1:] not in kept and c != "+out"] == []  # no checkpoint, no result


@pytest.mark.parametrize("command,argv,option", [
    ("sret-train-vision", [*VISION, "--no-save", "--warmup-epochs", "inf"], "--warmup-epochs"),
    ("sret-train-vision", [*VISION, "--no-save", "--lr", "inf"], "--lr"),
    ("sret-train-cifar", [*CIFAR, "--no-save", "--cutmix", "inf"], "--cutmix"),
    ("sret-train-cifar", [*CIFAR, "--no-save", "--mixup", "inf"], "--mixup"),
])
@pytest.mark.reliability("one-line-errors")
def test_infinite_rates_are_refused_by_name(tmp_path, command, argv, option):
    ran = run(tmp_path, command, *argv)
    assert ran.rc == 2 and f"argument {option}: must be a finite number, got inf" in ran.stderr
    assert "Traceback" not in ran.stderr and ran.changed == []


@pytest.mark.parametrize("command,argv,option", [
    ("sret-train-vision", [*VISION, "--no-save", "--seed", str(2 ** 70)], "--seed"),
    ("sret-train-cifar", [*CIFAR, "--no-save", "--split-seed", str(2 ** 70)], "--split-seed"),
    ("sret-train-cifar", [*CIFAR, "--no-save", "--seed", "-1"], "--seed"),
])
@pytest.mark.reliability("one-line-errors")
def test_seeds_no_generator_takes_are_refused_by_name(tmp_path, command, argv, option):
    ran = run(tmp_path, command, *argv)
    assert ran.rc == 2 and f"argument {option}: must be an integer from 0 to 4294967295" in ran.stderr
    assert "Traceback" not in ran.stderr and ran.changed == []


# ---------------------------------------------------------------- image folders
@pytest.mark.parametrize("command,argv", [
    ("sret-train-vision", [*VISION, *STEP, "--no-save", "--batch-size", "8"]),
    ("sret-train-vision", [*VISION, *STEP, "--no-save", "--batch-size", "8", "--workers", "1"]),
    ("sret-train-cifar", [*CIFAR, "--no-save"]),
])
@pytest.mark.reliability("one-line-errors")
def test_an_image_cut_short_is_named_in_one_line(tmp_path, command, argv):
    images(tmp_path)
    bad = tmp_path / "images/train/a/cut.png"
    noise_png(bad)
    bad.write_bytes(bad.read_bytes()[:600])
    ran = run(tmp_path, command, *argv)
    assert ran.rc == 1 and "images/train/a/cut.png: not a readable image" in one_line(ran, command)


@pytest.mark.parametrize("layout,message", [
    ("one-class", "images/train holds one class ('a'): a classifier needs two or more class folders"),
    ("empty-class", "images/train/c: a class folder with no images"),
])
@pytest.mark.parametrize("command,argv", [("sret-train-vision", [*VISION, "--no-save"]),
                                          ("sret-train-cifar", [*CIFAR, "--no-save"])])
@pytest.mark.reliability("inputs-as-they-seem")
def test_class_folders_that_teach_nothing_are_refused(tmp_path, command, argv, layout, message):
    images(tmp_path)
    for split in ("train", "val"):
        if layout == "one-class":
            for path in (tmp_path / "images" / split / "b").iterdir():
                path.unlink()
            (tmp_path / "images" / split / "b").rmdir()
        else:
            (tmp_path / "images" / split / "c").mkdir()
    ran = run(tmp_path, command, *argv)
    assert ran.rc == 1 and message in one_line(ran, command) and ran.changed == []


@pytest.mark.reliability("one-line-errors")
def test_a_damaged_torchvision_download_is_named(tmp_path):
    pytest.importorskip("torchvision")
    (tmp_path / "cifar" / "cifar-10-batches-py").mkdir(parents=True)
    (tmp_path / "cifar" / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"cut short")
    ran = run(tmp_path, "sret-train-cifar", *CIFAR[2:], "--data-dir", "cifar", "--no-save")
    assert ran.rc == 1 and "cifar: its torchvision CIFAR10 download is incomplete or damaged" in one_line(
        ran, "sret-train-cifar")


# ---------------------------------------------------------------- options the data or another option decides
@pytest.mark.parametrize("argv,message", [
    (["--model-kwargs", "num_classes=5"], "--model-kwargs: num_classes (set by the data's class folders)"),
    (["--drop-path", "0.1", "--model-kwargs", "drop_path_rate=0.3"], "drop_path_rate (set by --drop-path)"),
    (["--aa", "rand-zz"], "--aa rand-zz: unknown section 'zz'"),  # timm trains with its defaults
    (["--aa", "rand-m9-tnope"], "unknown section 'tnope'"),
    (["--aa", "garbage"], "a RandAugment config starts with 'rand'"),
    (["--opt", "nope"], "--opt nope: "),
])
@pytest.mark.reliability("inputs-as-they-seem")
def test_cifar_options_that_would_be_overridden_or_skipped_are_refused(tmp_path, argv, message):
    images(tmp_path)
    ran = run(tmp_path, "sret-train-cifar", *CIFAR, "--no-save", *argv)
    assert ran.rc == 2 and message in one_line(ran, "sret-train-cifar") and ran.changed == []


@pytest.mark.parametrize("argv,message", [
    (["--compile", "--compile-backend", "nope"], "--compile-backend nope: Invalid backend: 'nope'"),
    (["--compile", "--compile-mode", "nope"], "--compile-mode nope --compile-backend inductor: Unrecognized mode"),
    (["--compile-mode", "max-autotune"], "give --compile too"),  # it would do nothing
    (["--img-size", "48"], "--model sret_ext (num_classes=2, img_size=48): img_size (48, 48) must be a positive"),
])
@pytest.mark.reliability("one-line-errors")
def test_vision_options_torch_or_the_model_cannot_take_are_usage_errors(tmp_path, argv, message):
    images(tmp_path)
    ran = run(tmp_path, "sret-train-vision", *VISION, *STEP, "--no-save", *argv)
    assert ran.rc == 2 and message in one_line(ran, "sret-train-vision") and ran.changed == []


# ---------------------------------------------------------------- inputs inside the output, --force
@pytest.mark.parametrize("inputs", [
    ["--finetune", "out/checkpoint_best.pt"],
    ["--teacher", "sret_ext", "--teacher-checkpoint", "linked.pt"],  # a hard link to out/checkpoint_last.pt
])
@pytest.mark.reliability("one-run-per-output")
def test_an_input_inside_the_output_is_never_replaced_even_with_force(tmp_path, inputs):
    vision_run(tmp_path)
    os.link(tmp_path / "out/checkpoint_last.pt", tmp_path / "linked.pt")
    ran = run(tmp_path, "sret-train-vision", *VISION, *STEP, "--output", "out", "--force", *inputs)
    assert ran.rc == 2 and ": an input of this command" in one_line(ran, "sret-train-vision")
    assert ran.changed == []


@pytest.mark.reliability("one-run-per-output")
def test_dump_logits_onto_an_image_of_the_data_is_refused_even_with_force(tmp_path):
    images(tmp_path)
    vision_checkpoint(tmp_path)
    ran = run(tmp_path, "sret-train-vision", *VISION, "--checkpoint", "sret_ext.pt", "--dump-logits",
              "images/train/a/0.png", "--force")
    assert ran.rc == 2 and "images/train/a/0.png: an input of this command" in one_line(ran, "sret-train-vision")
    assert ran.changed == []


@pytest.mark.parametrize("resume,what", [
    ("other/checkpoint_best.pt", "no optimizer, scaler: a checkpoint_best.pt"),
    ("weights.pt", "model weights alone"),
    ("cifar.pt", "written by sret-train-cifar"),
])
@pytest.mark.reliability("one-run-per-output")
def test_force_keeps_the_old_run_when_its_resume_cannot_start(tmp_path, resume, what):
    vision_run(tmp_path)
    (tmp_path / "other").mkdir()
    vision_checkpoint(tmp_path, "other/checkpoint_best.pt", epoch=0, best_acc1=50.0)
    from fairseq_sret.vision import create_model

    torch.save(create_model("sret_ext", num_classes=2, img_size=32).state_dict(), tmp_path / "weights.pt")
    torch.save({"command": "sret-train-cifar", "model": {}, "epoch": 0}, tmp_path / "cifar.pt")
    ran = run(tmp_path, "sret-train-vision", *VISION, *STEP, "--epochs", "2", "--output", "out", "--force",
              "--resume", resume)
    line = one_line(ran, "sret-train-vision")
    assert ran.rc == 1 and f"{resume} is not the checkpoint_last.pt of a sret-train-vision run ({what}" in line
    assert ran.changed == []  # the old run's log.jsonl is still there


# ---------------------------------------------------------------- teachers and checkpoints tied to the data
@pytest.mark.reliability("tied-to-inputs")
def test_a_teacher_of_other_classes_is_refused(tmp_path):
    images(tmp_path)
    vision_checkpoint(tmp_path, "teacher.pt", classes=["x", "y"])
    ran = run(tmp_path, "sret-train-vision", *VISION, "--no-save", "--teacher", "sret_ext",
              "--teacher-checkpoint", "teacher.pt")
    assert ran.rc == 1 and "teacher.pt was trained on the classes ['x', 'y']" in one_line(ran, "sret-train-vision")

    logits = {"samples": [f"{c}/{i}.png" for c in "ab" for i in range(4)], "logits": torch.zeros(8, 3),
              "classes": ["a", "b", "c"]}
    torch.save(logits, tmp_path / "logits.pt")
    ran = run(tmp_path, "sret-train-vision", *VISION, "--no-save", "--teacher-logits", "logits.pt")
    assert ran.rc == 1 and "logits.pt holds the logits of 3 classes" in one_line(ran, "sret-train-vision")


@pytest.mark.reliability("tied-to-inputs")
def test_a_run_resumes_only_on_the_images_it_trained_on(tmp_path):
    images(tmp_path)
    assert run(tmp_path, "sret-train-vision", *VISION, *STEP, "--output", "out").rc == 0
    resume = [*VISION, *STEP, "--epochs", "2", "--output", "out", "--resume", "out/checkpoint_last.pt"]
    noise_png(tmp_path / "images/train/a/new.png")
    ran = run(tmp_path, "sret-train-vision", *resume)
    assert ran.rc == 1 and "out/checkpoint_last.pt was trained on other images" in one_line(ran, "sret-train-vision")
    assert ran.changed == []
    (tmp_path / "images/train/a/new.png").unlink()
    os.rename(tmp_path / "images", tmp_path / "moved")  # the same images elsewhere: the run goes on
    assert run(tmp_path, "sret-train-vision", *[a if a != "images" else "moved" for a in resume]).rc == 0


@pytest.mark.reliability("tied-to-inputs")
def test_a_checkpoint_is_evaluated_at_the_resolution_it_was_trained_at(tmp_path):
    images(tmp_path)
    vision_checkpoint(tmp_path)  # sret_ext at 32x32 (its default is 224)
    argv = [a for a in VISION if a not in ("--img-size", "32")]
    given = run(tmp_path, "sret-train-vision", *VISION, "--eval-only", "--checkpoint", "sret_ext.pt")
    default = run(tmp_path, "sret-train-vision", *argv, "--eval-only", "--checkpoint", "sret_ext.pt")
    assert given.rc == default.rc == 0
    assert json.loads(default.stdout.splitlines()[-1]) == json.loads(given.stdout.splitlines()[-1])


@pytest.mark.reliability("one-line-errors")
def test_count_names_an_option_the_model_does_not_take(tmp_path):
    ran = run(tmp_path, "sret-count", "vision", "mixer_b16", "--groups", "8,2", "4,1", "1,1")
    assert ran.rc == 2 and "--groups: mixer_b16 has no such setting" in one_line(ran, "sret-count")


# ---------------------------------------------------------------- the library and the benchmarks
@pytest.mark.parametrize("kwargs,message", [
    (dict(drop_path_rate=-0.1), "drop_path_rate must be in [0, 1), got -0.1"),  # not the per-block rate
    (dict(drop_path_rate=2.0), "drop_path_rate must be in [0, 1), got 2.0"),
    (dict(drop_rate=float("nan")), "drop_rate must be in [0, 1), got nan"),
])
@pytest.mark.reliability("one-line-errors")
def test_drop_rates_out_of_range_name_the_value_given(kwargs, message):
    from fairseq_sret.vision import create_model

    with pytest.raises(ValueError) as error:
        create_model("sret_ext", img_size=32, **kwargs)
    assert message in str(error.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
@pytest.mark.reliability("one-line-errors")
def test_a_benchmark_on_cuda_without_cuda_stops_in_one_line_before_it_runs(capsys):
    from benchmarks.common import pick_device

    with pytest.raises(SystemExit) as stop:
        pick_device("cuda")
    assert stop.value.code == 2 and "error: --device cuda: CUDA is not available" in capsys.readouterr().err
    assert pick_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("argv,message", [
    (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),  # a ValueError deep inside
    (["--repeats", "0"], "argument --repeats: must be at least 1, got 0"),  # the median of nothing
    (["--data", "nope"], "python -m benchmarks.bench_cifar_input: error: --data nope: no such folder"),
])
@pytest.mark.reliability("one-line-errors")
def test_the_cifar_input_benchmark_refuses_its_bad_options_in_one_line(tmp_path, capsys, argv, message):
    pytest.importorskip("timm")
    from benchmarks import bench_cifar_input

    with pytest.raises(SystemExit) as stop:
        bench_cifar_input.main(["--data", str(tmp_path), *argv])
    assert stop.value.code == 2 and message in capsys.readouterr().err
