"""Results that say something that did not happen: a finished run reused on other data, a report
that drops what it cannot reproduce, a fingerprint that reads part of its data, an average of two
runs, a test phase that cannot resume, a condition that changes unrecorded, a selection of nothing."""

import argparse
import collections
import json
import os
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("timm")
Image = pytest.importorskip("PIL.Image")

from fairseq_sret.checkpoints import average_checkpoints  # noqa: E402
from fairseq_sret_cli import average_checkpoints as average_command  # noqa: E402
from fairseq_sret_cli import experiments, plot_lrc, train_cifar  # noqa: E402
from fairseq_sret_cli.experiment_runner import ExperimentError, load_experiment  # noqa: E402
from fairseq_sret_cli.experiment_runner.image_runs import collect, parse_image_experiment  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")
FAST = ("--epochs 1 --batch-size 4 --val-split 4 --max-steps-per-epoch 1 --log-interval 0 --threads 1"
        " --eval-batch-size 8")


def write_images(root, sizes=(("train", 6, 32), ("test", 2, 32)), classes=("a", "b")):
    g = np.random.default_rng(0)
    for split, n, side in sizes:
        for label, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                colour = np.array([200 * (1 - label), 60, 200 * label])
                img = np.clip(colour + g.integers(-30, 31, (side, side, 3)), 0, 255)
                Image.fromarray(img.astype(np.uint8)).save(root / split / name / f"{i}.png")
    return root


@pytest.fixture
def images(tmp_path):
    return write_images(tmp_path / "data")


def experiment_file(tmp_path, rows, args=FAST, **fields):
    path = tmp_path / "ladder.yaml"
    path.write_text(json.dumps({"kind": "vision", "name": "tiny_ladder", "title": "tiny", "seeds": [1],
                                "train": {"args": args}, "rows": rows, **fields}))
    return path


def relabel(data):
    """The same images, the class folders' names swapped: every label changes, no file does."""
    for split in ("train", "test"):
        (data / split / "a").rename(data / split / "tmp")
        (data / split / "b").rename(data / split / "a")
        (data / split / "tmp").rename(data / split / "b")


def cifar_args(data, out, **extra):
    argv = ["--data-dir", str(data), "--model", "sret_cifar", "--batch-size", "4", "--val-split", "4", "--epochs", "2",
            "--warmup-epochs", "1", "--max-steps-per-epoch", "1", "--log-interval", "0", "--eval-batch-size", "8",
            "--output", str(out)]
    for k, v in extra.items():
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return argv


# ----------------------------------------------------------------------------- A
@pytest.mark.reliability("tied-to-inputs")
def test_a_finished_image_run_is_done_only_on_the_data_it_was_computed_on(images, tmp_path, capsys):
    rows = [{"id": "sret", "title": "SReT", "model": "sret_cifar"}]
    path = experiment_file(tmp_path, rows)
    common = [str(path), "--output", str(tmp_path / "runs"), "--results", str(tmp_path / "res")]
    assert experiments.main([*common, "--data", str(images)]) == 0
    experiment = parse_image_experiment(json.loads(path.read_text()), str(path))
    assert [r.status for r in collect(experiment, tmp_path / "runs", str(images))] == ["done"]
    # another data set given for the same run folder: not done, and its scores are nobody's
    other = write_images(tmp_path / "other", classes=("c", "d"))
    assert [r.status for r in collect(experiment, tmp_path / "runs", str(other))] == ["missing"]
    capsys.readouterr()
    assert experiments.main([*common, "--data", str(other)]) == 1  # sret-train-cifar refuses the folder's run
    assert "done already" not in capsys.readouterr().err
    # the same files relabelled in place
    relabel(images)
    capsys.readouterr()
    assert experiments.main([*common, "--data", str(images)]) == 1
    assert "done already" not in capsys.readouterr().err
    assert "trained on other data" in (tmp_path / "runs" / "sret" / "seed1" / "train.log").read_text()
    assert "missing (seeds 1)" in (tmp_path / "res" / "tiny_ladder.md").read_text()


# ----------------------------------------------------------------------------- B
@pytest.mark.reliability("reports-keep-results")
def test_a_report_keeps_every_recorded_result_and_says_why_it_does_not_count_one(images, tmp_path):
    rows = [{"id": "sret", "title": "SReT", "model": "sret_cifar"}]
    path = experiment_file(tmp_path, rows)
    res = tmp_path / "res"
    assert experiments.main([str(path), "--data", str(images), "--output", str(tmp_path / "runs"),
                             "--results", str(res)]) == 0
    committed = json.loads((res / "tiny_ladder.json").read_text())["runs"][0]
    (res / ".sret-outputs.json").unlink()  # a clone: the committed results, no run folders
    other = write_images(tmp_path / "other", classes=("c", "d"))
    clone = [str(path), "--output", str(tmp_path / "clone"), "--results", str(res), "--report-only"]
    assert experiments.main([*clone, "--data", str(other)]) == 0
    kept = json.loads((res / "tiny_ladder.json").read_text())["runs"][0]
    assert kept["status"] == "done" and kept["result"] == committed["result"] and kept["history"] == committed["history"]
    assert "fingerprints differ" in kept["not_matching"]
    table = (res / "tiny_ladder.md").read_text()
    assert "missing (seeds 1)" in table and "sret/seed1: its data fingerprints differ" in table
    # on the data it was computed on, the same report counts it again
    assert experiments.main([*clone, "--data", str(images)]) == 0
    again = json.loads((res / "tiny_ladder.json").read_text())["runs"][0]
    assert again == committed
    # a run done again on other data keeps the recorded one among the earlier runs
    assert experiments.main([*clone[:-1], "--data", str(other)]) == 0
    stored = json.loads((res / "tiny_ladder.json").read_text())
    assert stored["runs"][0]["status"] == "done" and stored["runs"][0]["result"] != committed["result"]
    assert [r["result"] for r in stored["earlier_runs"]] == [committed["result"]]


# ----------------------------------------------------------------------------- C
@pytest.mark.reliability("tied-to-inputs")
def test_every_data_fingerprint_reads_all_of_its_data(tmp_path):
    from fairseq_sret_cli.data.download import archive_identity
    from fairseq_sret_cli.experiment_runner.settings import data_fingerprint
    from fairseq_sret_cli.image_folder import ImageFolder
    from fairseq_sret_cli.prepare import corpus_fingerprint

    def edit_in_place(path, offset):
        """One byte changed at ``offset``, the size kept, the clock moved on."""
        stat = path.stat()
        with open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(b"y" if byte != b"y" else b"z")
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        assert path.stat().st_size == stat.st_size

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = corpus / "train.en"
    text.write_bytes(b"a few words of a caption\n" * (3 * 2 ** 20 // 25))  # > 2 MiB: its middle is past the first MiB
    data_bin = tmp_path / "data-bin"
    data_bin.mkdir()
    (data_bin / "dict.en.txt").write_text("a 1\n")
    (data_bin / "train.en-de.en.bin").write_bytes(bytes(4096))
    archive = tmp_path / "corpus.tgz"
    archive.write_bytes(bytes(2 ** 21 + 10))
    folder = write_images(tmp_path / "images", sizes=(("train", 2, 8),))
    image = folder / "train" / "a" / "0.png"

    def fingerprints():
        return (corpus_fingerprint(corpus, tmp_path / "out", lambda name: False, tmp_path / "work"),
                data_fingerprint(str(data_bin)), archive_identity(archive), ImageFolder(str(folder / "train")).fingerprint())

    before = fingerprints()
    edit_in_place(text, 2 ** 20 + 12345)
    edit_in_place(data_bin / "train.en-de.en.bin", 2000)
    edit_in_place(archive, 2 ** 20 + 1)
    edit_in_place(image, image.stat().st_size // 2)
    after = fingerprints()
    assert [a != b for a, b in zip(before, after)] == [True, True, True, True]


# ----------------------------------------------------------------------------- D
def fairseq_checkpoint(seed, epoch, **optimizer):
    g = torch.Generator().manual_seed(100 * seed + epoch)
    return {"args": argparse.Namespace(arch="transformer", seed=seed),
            "cfg": {"common": {"seed": seed}, "model": {"arch": "transformer"}, "optimizer": {"lr": [1e-3], **optimizer}},
            "model": collections.OrderedDict([("w", torch.randn(3, generator=g))]),
            "optimizer_history": [{"num_updates": 10 * epoch}], "extra_state": {"train_iterator": {"epoch": epoch}}}


@pytest.mark.reliability("metadata-survives")
def test_checkpoints_of_different_runs_do_not_average_and_an_average_names_its_inputs(images, tmp_path, capsys):
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    torch.save(fairseq_checkpoint(1, 1), seeds / "a.pt")
    torch.save(fairseq_checkpoint(2, 1), seeds / "b.pt")
    with pytest.raises(ValueError, match=r"b\.pt is of another run than .*a\.pt \(seed 2 against 1\)"):
        average_checkpoints([seeds / "a.pt", seeds / "b.pt"])
    # two runs in one folder: the last epochs of each
    folder = tmp_path / "folder"
    folder.mkdir()
    torch.save(fairseq_checkpoint(1, 1), folder / "checkpoint1.pt")
    torch.save(fairseq_checkpoint(1, 2, betas="(0.9, 0.98)"), folder / "checkpoint2.pt")
    capsys.readouterr()
    assert average_command.main(["--inputs", str(folder), "--num-epoch-checkpoints", "2",
                                 "--output", str(tmp_path / "avg.pt")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "is of another run than" in err[-1] and "optimizer" in err[-1] and err[-1].startswith("sret-average")
    assert not (tmp_path / "avg.pt").exists()
    # two CIFAR runs on differently labelled data
    assert train_cifar.main(cifar_args(images, tmp_path / "first", epochs=1)) == 0
    relabel(images)
    assert train_cifar.main(cifar_args(images, tmp_path / "second", epochs=1)) == 0
    firsts = [tmp_path / "first" / "checkpoint_last.pt", tmp_path / "second" / "checkpoint_last.pt"]
    with pytest.raises(ValueError, match="another run.*data"):
        average_checkpoints(firsts)
    # one run's checkpoints average, and the average says which
    torch.save(fairseq_checkpoint(1, 2), folder / "checkpoint2.pt")
    average = average_checkpoints([folder / "checkpoint2.pt", folder / "checkpoint1.pt"])
    assert [a["path"] for a in average["averaged_from"]] == [str((folder / f"checkpoint{e}.pt").resolve()) for e in (2, 1)]
    assert len({a["run"] for a in average["averaged_from"]}) == 1 and average["averaged_from"][0]["seed"] == 1


# ----------------------------------------------------------------------------- E
@pytest.mark.reliability("interruption")
def test_a_run_killed_between_its_training_and_its_test_resumes_to_its_test(images, tmp_path, capsys):
    out = tmp_path / "runs" / "sret" / "seed1"
    rows = [{"id": "sret", "title": "SReT", "model": "sret_cifar"}]
    path = experiment_file(tmp_path, rows)
    common = [str(path), "--data", str(images), "--output", str(tmp_path / "runs"), "--results", str(tmp_path / "res")]
    assert experiments.main(common) == 0
    finished = json.loads((out / "result.json").read_text())
    (out / "result.json").unlink()  # killed while it tested: trained, not tested (nor reported)
    (tmp_path / "res" / "tiny_ladder.json").unlink()
    assert experiments.main(common) == 0  # the runner resumes it: its test runs
    tested = json.loads((out / "result.json").read_text())
    assert tested["test"] == finished["test"] and tested["cpu_seconds"] == finished["cpu_seconds"]
    # by hand: --resume tests it; once tested, there is nothing to resume
    (out / "result.json").unlink()
    argv = ["--data-dir", str(images), "--model", "sret_cifar", *FAST.split(), "--seed", "1", "--output", str(out)]
    assert train_cifar.main([*argv, "--resume"]) == 0
    assert json.loads((out / "result.json").read_text())["test"] == finished["test"]
    assert train_cifar.main([*argv, "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err


# ----------------------------------------------------------------------------- F
@pytest.mark.reliability("conditions-recorded")
def test_a_condition_that_changes_the_result_is_recorded_or_refused(images, tmp_path, monkeypatch, capsys):
    # a run resumed with another --threads records both counts
    out = tmp_path / "threads"
    batches = train_cifar.CifarRun.batches

    def killed_in_the_second_epoch(self, epoch):
        if epoch == 1:
            raise KeyboardInterrupt
        return batches(self, epoch)

    monkeypatch.setattr(train_cifar.CifarRun, "batches", killed_in_the_second_epoch)
    assert train_cifar.main(cifar_args(images, out, threads=1)) == 130
    monkeypatch.setattr(train_cifar.CifarRun, "batches", batches)
    assert train_cifar.main(cifar_args(images, out, threads=2, resume=True)) == 0
    assert json.loads((out / "result.json").read_text())["threads"] == "1 + 2"
    assert "resumed with 2 threads, its last epoch trained with 1" in capsys.readouterr().err
    # test images of another size than the training ones
    sizes = write_images(tmp_path / "sizes", sizes=(("train", 6, 32), ("test", 2, 24)))
    capsys.readouterr()
    assert train_cifar.main(cifar_args(sizes, tmp_path / "sizes-run")) == 1
    assert "test images are 24x24, the training images 32x32" in capsys.readouterr().err
    # a class that the validation split leaves without training images
    few = write_images(tmp_path / "few", sizes=(("train", 4, 32), ("test", 2, 32)))
    for i in (1, 2, 3):
        (few / "train" / "b" / f"{i}.png").unlink()  # one image of b, which validation holds out
    assert train_cifar.main(cifar_args(few, tmp_path / "few-run", val_split=2, batch_size=2)) == 1
    err = capsys.readouterr().err
    assert "has no training images once --val-split 2" in err
    assert not (tmp_path / "sizes-run" / "result.json").exists() and not (tmp_path / "few-run" / "result.json").exists()
    # sret-plot-lrc draws a vision checkpoint it is given, or refuses it
    pytest.importorskip("matplotlib")
    vision = out / "checkpoint_last.pt"
    assert plot_lrc.main([str(vision), "--output", str(tmp_path / "vision.png")]) == 0
    from fairseq_sret_cli.evaluation import lrc

    assert lrc.collect([vision]).epochs == [2]
    translation = tmp_path / "translation.pt"
    model = collections.OrderedDict([("encoder.layers.0.recursive.layer.ffn_residual.skip_scale", torch.ones(1))])
    torch.save({"model": model, "optimizer_history": [{"num_updates": 2}]}, translation)
    capsys.readouterr()
    assert plot_lrc.main([str(translation), str(vision), "--output", str(tmp_path / "both.png")]) == 1
    assert "other LRC coefficients" in capsys.readouterr().err and not (tmp_path / "both.png").exists()


# ----------------------------------------------------------------------------- G
@pytest.mark.reliability("inputs-as-they-seem")
def test_a_selection_of_nothing_and_a_row_id_that_is_a_path_are_refused(images, tmp_path, capsys):
    rows = [{"id": "sret", "title": "SReT", "model": "sret_cifar", "seeds": [1, 2]}]
    common = ["--data", str(images), "--output", str(tmp_path / "runs"), "--results", str(tmp_path / "res")]
    for selection, message in ((["--rows", "nope"], "no rows ['nope']"), (["--seeds", "9"], "no selected row has the seeds [9]"),
                               (["--rows", "sret", "--seeds", "1", "9"], "seeds [9]")):
        for mode in ([], ["--dry-run"], ["--report-only"]):
            capsys.readouterr()
            assert experiments.main([str(experiment_file(tmp_path, rows)), *common, *selection, *mode]) == 2
            assert message in capsys.readouterr().err
    for bad in ("../../escape", "a/b", ".hidden", ""):
        path = experiment_file(tmp_path, [dict(rows[0], id=bad)])
        capsys.readouterr()
        assert experiments.main([str(path), *common]) == 2
        assert "id" in capsys.readouterr().err
    capsys.readouterr()
    assert experiments.main([str(experiment_file(tmp_path, rows, name="../out")), *common]) == 2
    assert not (tmp_path / "runs").exists() and not (tmp_path / "res").exists() and not (tmp_path.parent / "escape").exists()
    # a translation file refuses a row it does not have with the same check
    translation = tmp_path / "nmt.yaml"
    translation.write_text(json.dumps({"name": "nmt", "train": {"max_update": 2}, "rows": [{"id": "t", "arch": "x"}]}))
    with pytest.raises(ExperimentError, match=r"no rows \['nope'\]"):
        load_experiment(translation).select(["nope"])
    translation.write_text(json.dumps({"name": "nmt", "train": {"max_update": 2}, "rows": [{"id": "../t", "arch": "x"}]}))
    with pytest.raises(ExperimentError, match="plain file name"):
        load_experiment(translation)
