"""What a hostile trial of the writing commands found, held at the class level.

- ``--force`` over an earlier run replaces its files only once the new run has written its own
  (:meth:`fairseq_sret_cli.outputs.Outputs.starting_over`): a new run that fails, is
  interrupted or killed before its first epoch is saved leaves the old run as it was.
- A file several processes share is read and rewritten under its folder's lock
  (:func:`fairseq_sret_cli.outputs.locked`): the output check is made again at the rename, and
  a results writer merges what another process recorded.
- The benchmarks' outputs follow the same rule, checked when the command line is read.
- A full disk at any save is one line naming the file, and the file already there is kept.
"""

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("PIL")

from bad_input_cases import images, transformer_checkpoint, write  # noqa: E402
from conftest import requires_fairseq  # noqa: E402
from fairseq_sret_cli.outputs import MANIFEST, OutputInTheWay, Outputs, read_manifest  # noqa: E402
from test_vision_command_refusals import CIFAR, STEP, run  # noqa: E402
from bad_input_cases import VISION  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def digests(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
            and p.name != ".sret-lock"}


def one_error(ran, command: str) -> str:
    lines = [line for line in ran.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in ran.stderr and 'File "' not in ran.stderr, ran.stderr[-2000:]
    assert lines and lines[-1].startswith(f"{command}: "), ran.stderr[-2000:]
    return lines[-1]


# ---------------------------------------------------------------- --force never costs the old run first
TRAININGS = {
    "sret-train-cifar": [*CIFAR, "--output", "out"],
    "sret-train-vision": [*VISION, *STEP, "--output", "out"],
}


class Stop(Exception):
    pass


@pytest.mark.parametrize("command", sorted(TRAININGS))
@pytest.mark.parametrize("failure", [ValueError("the loss diverged"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
@pytest.mark.reliability("one-run-per-output")
def test_force_keeps_the_old_run_until_the_new_one_has_saved_its_own(tmp_path, monkeypatch, command, failure):
    images(tmp_path)
    assert run(tmp_path, command, *TRAININGS[command]).rc == 0
    before, entries = digests(tmp_path / "out"), read_manifest(tmp_path / "out")
    assert {"checkpoint_last.pt", "log.jsonl"} <= set(before)

    def fail(*args, **kwargs):  # the new run fails at its first update
        raise failure

    with monkeypatch.context() as patched:
        patched.setattr(torch.Tensor, "backward", fail)
        ran = run(tmp_path, command, *TRAININGS[command], "--force", "--seed", "3")
    assert ran.rc == (130 if isinstance(failure, KeyboardInterrupt) else 1)
    assert digests(tmp_path / "out") == before and read_manifest(tmp_path / "out") == entries
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")) \
        == sorted(n for n in (MANIFEST, ".sret-lock") if (tmp_path / "out" / n).exists())
    # once the new run has saved an epoch, its files replace the old run's, all of them
    assert run(tmp_path, command, *TRAININGS[command], "--force", "--seed", "3").rc == 0
    after = digests(tmp_path / "out")
    assert after["checkpoint_last.pt"] != before["checkpoint_last.pt"] and not (tmp_path / "out/.sret-replaced").exists()


@pytest.mark.reliability("one-run-per-output")
def test_a_start_over_killed_before_its_first_save_is_undone_by_the_next_command(tmp_path):
    folder = tmp_path / "out"
    outputs = Outputs("cmd", settings={"run": 1})
    for name in ("last.pt", "log.jsonl"):
        outputs.write_text(folder / name, f"old {name}")
    before, entries = digests(folder), read_manifest(folder)
    killed = subprocess.run([sys.executable, "-c", (
        "import os, sys; from fairseq_sret_cli.outputs import Outputs, exclusive\n"
        f"outputs = Outputs('cmd', force=True, settings={{'run': 2}})\n"
        f"with exclusive({str(folder)!r}, 'cmd'), outputs.starting_over({str(folder)!r}, ['last.pt', 'log.jsonl']):\n"
        f"    outputs.write_text({str(folder / 'last.pt')!r}, 'new, half a run')\n"
        "    os._exit(9)\n")], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert killed.returncode == 9 and (folder / ".sret-replaced").is_dir()
    Outputs("cmd", settings={"run": 1}).check([], folders=[folder])  # the next command looks at the folder
    assert digests(folder) == before and read_manifest(folder) == entries
    assert not (folder / ".sret-replaced").exists()


# ---------------------------------------------------------------- shared files: under a lock, merged
@pytest.mark.reliability("shared-files")
def test_an_output_written_meanwhile_by_another_process_is_checked_again_at_the_rename(tmp_path):
    target = tmp_path / "avg.pt"
    with pytest.raises(OutputInTheWay, match="made by avg with other settings"):
        with Outputs("avg", settings={"inputs": "a"}).writing(target) as tmp:
            tmp.write_text("a's average")
            Outputs("avg", settings={"inputs": "b"}).write_text(target, "b's average")  # b finished first
    assert target.read_text() == "b's average" and read_manifest(tmp_path)["avg.pt"]["settings"] == {"inputs": "b"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "avg.pt"]


@requires_fairseq
@pytest.mark.reliability("shared-files")
def test_two_averages_into_one_new_output_never_replace_each_other(tmp_path, monkeypatch):
    from bad_input_cases import run_here

    for name in ("a.pt", "b.pt", "c.pt"):
        transformer_checkpoint(tmp_path, name)
    save = torch.save
    second = []

    def meanwhile(state, f, *args, **kwargs):  # the other process averages into the same output while this one saves
        if not second:
            second.append(None)
            second[0] = run_here(tmp_path, "sret-average-checkpoints", "--inputs", "a.pt", "c.pt", "--output",
                                 "avg.pt")
        return save(state, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", meanwhile)
    rc, err, _ = run_here(tmp_path, "sret-average-checkpoints", "--inputs", "a.pt", "b.pt", "--output", "avg.pt")
    assert second[0][0] == 0 and rc == 2 and "made by sret-average-checkpoints with other settings" in err
    assert read_manifest(tmp_path)["avg.pt"]["settings"]["inputs"][-1].endswith("c.pt")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.reliability("shared-files")
def test_two_experiment_runners_sharing_a_results_file_both_keep_their_runs(tmp_path, monkeypatch):
    pytest.importorskip("timm")
    from test_image_runs import experiment_file

    from fairseq_sret_cli import experiments
    from fairseq_sret_cli.experiment_runner import image_runs

    data = _image_data(tmp_path)
    path = experiment_file(tmp_path, [{"id": "one", "model": "sret_cifar_baseline"},
                                      {"id": "two", "model": "sret_cifar_baseline", "args": "--lr 2e-3"}])
    results = tmp_path / "res"
    common = [str(path), "--data", str(data), "--results", str(results)]
    train = image_runs.run_image_experiment
    other = []

    def meanwhile(*args, **kwargs):  # the second runner trains and reports while the first one trains
        failed = train(*args, **kwargs)
        if not other:
            other.append(None)
            other[0] = experiments.main([*common, "--rows", "two", "--output", str(tmp_path / "runs_b")])
        return failed

    monkeypatch.setattr(image_runs, "run_image_experiment", meanwhile)
    assert experiments.main([*common, "--rows", "one", "--output", str(tmp_path / "runs_a")]) == 0
    assert other == [0]
    report = json.loads((results / "tiny_ladder.json").read_text())
    assert [(r["row"], r["status"]) for r in report["runs"]] == [("one", "done"), ("two", "done")]


def _image_data(tmp_path):
    import numpy as np
    from PIL import Image

    g = np.random.default_rng(0)
    for split, n in (("train", 6), ("test", 2)):
        for label, name in enumerate(("a", "b")):
            (tmp_path / "data" / split / name).mkdir(parents=True)
            for i in range(n):
                colour = np.array([200 * (1 - label), 60, 200 * label])
                img = np.clip(colour + g.integers(-30, 31, (32, 32, 3)), 0, 255)
                Image.fromarray(img.astype(np.uint8)).save(tmp_path / "data" / split / name / f"{i}.png")
    return tmp_path / "data"


# ---------------------------------------------------------------- the benchmarks follow the rule
def _json_benchmarks():
    from benchmarks.__main__ import BENCHMARKS

    names = []
    for name in sorted(BENCHMARKS):
        try:
            module = __import__(BENCHMARKS[name].module, fromlist=["build_parser"])
        except ModuleNotFoundError:  # bench_nmt imports fairseq at import time
            continue
        if "--json" in module.build_parser().shared_options:
            names.append((name, module))
    return names


@pytest.mark.reliability("one-run-per-output")
def test_no_benchmark_writes_over_a_user_s_file_or_an_input_and_says_so_before_measuring(tmp_path, capsys):
    from test_benchmarks_cli import required_arguments

    from benchmarks.common import benchmark_parser, write_json

    mine = write(tmp_path, "mine.json", "the user's\n")
    os.symlink(mine, tmp_path / "link.json")
    with_input = benchmark_parser("t")
    with_input.add_argument("--checkpoint")
    cases = [(name, module.build_parser(), [given]) for name, module in _json_benchmarks()
             for given in ("mine.json", "link.json")]
    # an input (a file another option names) is refused even with --force
    cases.append(("an input", with_input, ["link.json", "--checkpoint", str(mine), "--force"]))
    for name, parser, given in cases:
        device = ["--device", "cpu"] if "--device" in parser.shared_options else []
        with pytest.raises(SystemExit) as stop:
            parser.parse_args([*required_arguments(parser), *device, "--json", str(tmp_path / given[0]), *given[1:]])
        assert stop.value.code == 2, name
        message = capsys.readouterr().err.strip().splitlines()[-1]
        assert "error:" in message and ("not made by" in message or "an input" in message), (name, message)
        assert mine.read_text() == "the user's\n" and (tmp_path / "link.json").is_symlink()
    # with --force the benchmark's file replaces the link, never the file it leads to

    args = benchmark_parser("t").parse_args(["--json", str(tmp_path / "link.json"), "--force"])
    write_json(args.json, {"tables": []})
    assert mine.read_text() == "the user's\n" and not (tmp_path / "link.json").is_symlink()


@pytest.mark.reliability("one-run-per-output")
def test_a_figure_never_replaces_the_results_file_it_reads(tmp_path, capsys):
    pytest.importorskip("yaml")
    from benchmarks.bench_cifar_depth import main

    path = tmp_path / "ladder.yaml"
    path.write_text(json.dumps({"kind": "vision", "name": "depth", "title": "t", "seeds": [1],
                                "train": {"args": "--epochs 1"}, "rows": [{"id": "r", "model": "sret_cifar"}]}))
    results = write(tmp_path, "res/depth.json", json.dumps({"experiment": "depth", "runs": []}))
    before = results.read_bytes()
    with pytest.raises(SystemExit) as stop:
        main([str(path), "--data", str(tmp_path), "--output", str(tmp_path / "runs"), "--results",
              str(tmp_path / "res"), "--out", str(tmp_path / "res" / "depth.png"), "--force"])
    assert stop.value.code == 2 and "an input" in capsys.readouterr().err
    assert results.read_bytes() == before and not (tmp_path / "res" / "depth.png").exists()


# ---------------------------------------------------------------- a full disk is one line
def _full_disk(monkeypatch, error):
    """Every torch.save and text write from now on writes a little, then fails as a full disk does."""
    save = torch.save
    write_text = Path.write_text

    def saving(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"PK\x03\x04 part")
        raise error

    def writing(self, *args, **kwargs):
        if self.name.endswith(".tmp"):
            write_text(self, "part")
            raise error
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(torch, "save", saving)
    monkeypatch.setattr(Path, "write_text", writing)
    return save


FULL = [OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EDQUOT, "Disk quota exceeded")]


@pytest.mark.parametrize("error", FULL, ids=["ENOSPC", "EDQUOT"])
@pytest.mark.parametrize("command", sorted(TRAININGS))
@pytest.mark.reliability("one-line-errors")
def test_a_full_disk_at_a_save_is_one_line_and_keeps_the_old_files(tmp_path, monkeypatch, command, error):
    images(tmp_path)
    assert run(tmp_path, command, *TRAININGS[command]).rc == 0
    before = digests(tmp_path / "out")
    with monkeypatch.context() as patched:
        _full_disk(patched, error)
        ran = run(tmp_path, command, *TRAININGS[command], "--force")
    line = one_error(ran, command)
    assert ran.rc == 1 and "out/checkpoint_" in line and ("no space left" in line or "quota" in line), line
    assert digests(tmp_path / "out") == before
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp") or p.name == ".sret-replaced"]


@requires_fairseq
@pytest.mark.parametrize("command, argv, target", [
    ("sret-average-checkpoints", ["--inputs", "a.pt", "b.pt", "--output", "avg.pt", "--force"], "avg.pt"),
    ("sret-uptrain", ["a.pt", "avg.pt", "--force"], "avg.pt"),
])
@pytest.mark.reliability("one-line-errors")
def test_a_full_disk_at_a_translation_save_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch, command, argv,
                                                                              target):
    from bad_input_cases import run_here

    transformer_checkpoint(tmp_path, "a.pt")
    transformer_checkpoint(tmp_path, "b.pt")
    old = write(tmp_path, target, "an older file\n")
    with monkeypatch.context() as patched:
        _full_disk(patched, FULL[0])
        rc, err, changed = run_here(tmp_path, command, *argv)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc == 1 and "Traceback" not in err and lines[-1].startswith(f"{command}: error: {target}: no space left")
    assert old.read_text() == "an older file\n" and not [c for c in changed if c.endswith(".tmp")]


# ---------------------------------------------------------------- options checked before any work
@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "5"], "--batch-size 5: Mixup/CutMix .* even batch"),
    (["--batch-size", "7", "--mixup", "0"], "--batch-size 7: Mixup/CutMix"),
    (["--sched", "none"], "--sched none: timm builds no scheduler"),
    (["--sched", "plateau"], "--sched plateau: "),
    (["--sched", "cosin"], "--sched cosin: "),
    (["--no-save", "--resume"], "--resume acts on the run in --output"),
    (["--no-save", "--force"], "--force acts on the run in --output"),
])
@pytest.mark.reliability("one-line-errors")
def test_training_options_timm_would_fail_on_mid_run_are_refused_before_the_data_is_read(tmp_path, argv, message):
    import re

    from fairseq_sret_cli import train_cifar

    given = ["--data-dir", "no-such-folder", "--model", "sret_cifar", *argv]
    if "--no-save" not in argv:
        given += ["--output", "out"]
    ran = run(tmp_path, "sret-train-cifar", *given)
    line = one_error(ran, "sret-train-cifar")
    assert ran.rc == 2 and re.search(message, line) and "no-such-folder" not in line, line
    assert ran.changed == []
    if "--no-save" not in argv:  # what a runner checks before it starts any run
        with pytest.raises(train_cifar.UsageError, match=message):
            train_cifar.check_command(given)


@pytest.mark.parametrize("name, argv, mine", [
    ("flops_per_token", ["no-such-experiment.yaml", "--data", "bin", "--out", "table.md"], "table.md"),
    # the table's .json beside it would be the experiment file it reads: refused even with --force
    ("flops_per_token", ["table.json", "--data", "bin", "--out", "table.md", "--force"], "table.json"),
    ("quickstart_budget", ["--results", ".", "--report-only", "--out", "no-runs"], "quickstart_budget.md"),
])
@pytest.mark.reliability("one-run-per-output")
def test_a_benchmark_s_table_never_replaces_a_user_s_file_or_an_input_and_says_so_first(tmp_path, monkeypatch,
                                                                                      capsys, name, argv, mine):
    import importlib

    write(tmp_path, mine, "the user's\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        importlib.import_module(f"benchmarks.{name}").main(argv)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 2 and ("not made by" in line or "an input" in line), line
    assert (tmp_path / mine).read_text() == "the user's\n"


@pytest.mark.reliability("one-line-errors")
def test_a_full_disk_in_a_write_that_names_no_file_is_still_one_line(tmp_path, monkeypatch):
    from bad_input_cases import run_here

    assert run_here(tmp_path, "sret-toy-data", "corpus")[0] == 0
    before = digests(tmp_path / "corpus")

    def full(self, *args, **kwargs):  # Python's own writes raise ENOSPC without the file's name
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    rc, err, _ = run_here(tmp_path, "sret-toy-data", "corpus", "--seed", "3", "--force")
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc == 1 and "Traceback" not in err and lines[-1].startswith("sret-toy-data: error: no space left"), err
    assert digests(tmp_path / "corpus") == before


@requires_fairseq
@pytest.mark.reliability("one-line-errors")
def test_a_full_disk_in_a_library_s_own_write_is_one_line_naming_the_output(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from bad_input_cases import run_here
    from test_outputs import checkpoint_and_data_bin

    from fairseq_sret.hf import convert

    checkpoint_and_data_bin(tmp_path)
    assert run_here(tmp_path, "sret-export-hf", "sret.pt", "--data-bin", "bin", "--out", "hf")[0] == 0
    before = digests(tmp_path / "hf")
    export = convert.export_checkpoint

    def full(checkpoint, data_bin, folder):  # safetensors' own error, as a full disk gives it
        export(checkpoint, data_bin, folder)
        raise Exception("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(convert, "export_checkpoint", full)
    rc, err, _ = run_here(tmp_path, "sret-export-hf", "sret.pt", "--data-bin", "bin", "--out", "hf")
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc == 1 and "Traceback" not in err and lines[-1].startswith("sret-export-hf: error: hf: no space left"), err
    assert digests(tmp_path / "hf") == before and not [p for p in (tmp_path / "hf").iterdir() if p.is_dir()]


@requires_fairseq
@pytest.mark.parametrize("new_checkpoint", [False, True], ids=["failed-before-a-checkpoint", "saved-one"])
@pytest.mark.reliability("one-run-per-output")
def test_experiments_force_keeps_a_changed_run_until_its_new_training_saves(tmp_path, new_checkpoint):
    from test_binding import EXPERIMENT, ROW, experiment_of, trained_run

    from fairseq_sret_cli.experiment_runner.run_folder import RUN_OUTPUTS, run_paths
    from fairseq_sret_cli.experiment_runner.settings import check_run_folder, run_settings, settle_start_over

    root = trained_run(tmp_path)
    before = digests(root)
    write(tmp_path, "exp.yaml", EXPERIMENT + ROW.replace("1e-3", "5e-4"))
    exp = experiment_of(tmp_path)
    run_ = exp.runs()[0]
    paths = run_paths(tmp_path / "runs", run_)
    settings = run_settings(exp, run_, str(tmp_path / "bin"), tmp_path / "runs", False, None, None, None)
    assert check_run_folder(run_, paths, settings, force=True) is None  # the new training may start
    assert not any((root / name).exists() for name in RUN_OUTPUTS)
    write(root, "train.log", "the new training's first lines\n")
    if new_checkpoint:
        write(root, "checkpoints/checkpoint_last.pt", "the new training's weights")
    settle_start_over(paths)  # what the runner does when the training ends, fails or is stopped
    if new_checkpoint:
        assert (root / "train.log").read_text() == "the new training's first lines\n"
        assert not (root / ".sret-replaced").exists()
    else:
        assert digests(root) == before and not (root / ".sret-replaced").exists()
    if not new_checkpoint:  # a runner killed in between: the next check puts the earlier run back first
        assert check_run_folder(run_, paths, settings, force=True) is None
        assert "with other settings (--lr 1e-3 -> 5e-4)" in check_run_folder(run_, paths, settings)
        assert digests(root) == before


@pytest.mark.reliability("one-line-errors")
def test_a_save_that_fails_on_a_filesystem_without_a_disk_is_not_called_a_full_disk():
    """torch's writer names no errno; where it could not even open the file (``/proc``, whose
    free space reads as zero), its own reason is the message, not "no space left"."""
    import torch

    from fairseq_sret.atomic_files import disk_full

    with pytest.raises(RuntimeError) as failed:
        torch.save({"x": 1}, "/proc/sret-test.pt")
    assert disk_full(failed.value, "/proc/sret-test.pt") is None
