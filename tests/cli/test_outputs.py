"""Nothing a user has is ever lost: the rule of every command that writes
(``fairseq_sret_cli/outputs.py``), checked on the rule itself and on every writing command.

The property, for each command of ``WRITERS`` (which must list every ``sret-*`` command that
writes): run against an output that already holds files it did not make - at every path it
would write, and beside them - it exits 2 naming them and changes nothing; with ``--force`` it
replaces exactly its own outputs and leaves the files beside them as they were; an output that
is one of its inputs is refused even with ``--force``.
"""

import errno
import fcntl
import hashlib
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List

import pytest
import torch

from bad_input_cases import MAINS, TRANSLATION_COMMANDS, corpus, images, run_case_here, transformer_checkpoint, write
from conftest import HAVE_FAIRSEQ, requires_fairseq
from fairseq_sret_cli.outputs import MANIFEST, Busy, OutputInTheWay, Outputs, exclusive

REPO = Path(__file__).resolve().parents[2]
FOREIGN = "a file the user made\n"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- the rule itself
@pytest.mark.reliability("one-run-per-output")
def test_a_file_the_command_did_not_make_is_refused_and_force_replaces_it(tmp_path):
    target = write(tmp_path, "out.txt", FOREIGN)
    with pytest.raises(OutputInTheWay, match=r"out.txt: exists, not made by cmd; .*--force"):
        Outputs("cmd").write_text(target, "new")
    assert target.read_text() == FOREIGN
    Outputs("cmd", force=True).write_text(target, "new")
    assert target.read_text() == "new"


@pytest.mark.reliability("one-run-per-output")
def test_own_files_are_refreshed_with_the_same_settings_and_kept_with_others(tmp_path):
    target = tmp_path / "out.txt"
    Outputs("cmd", settings={"beam": 5}).write_text(target, "first")
    Outputs("cmd", settings={"beam": 5}).write_text(target, "again")  # the same settings: a refresh
    assert target.read_text() == "again"
    with pytest.raises(OutputInTheWay, match=r"made by cmd with other settings \(beam=5; now beam=4\)"):
        Outputs("cmd", settings={"beam": 4}).write_text(target, "other")
    with pytest.raises(OutputInTheWay, match=r"out.txt: made by cmd; choose another output, or pass --force"):
        Outputs("other-cmd").write_text(target, "other")
    assert target.read_text() == "again"


@pytest.mark.reliability("one-run-per-output")
def test_an_input_is_never_replaced_through_links_not_even_with_force(tmp_path):
    source = write(tmp_path, "in.pt", "weights")
    os.symlink(source, tmp_path / "soft.pt")
    os.link(source, tmp_path / "hard.pt")
    outputs = Outputs("cmd", force=True, inputs=[source])
    for name in ("in.pt", "soft.pt", "hard.pt"):
        with pytest.raises(OutputInTheWay, match=rf"{name}: an input of this command.*; choose another output$"):
            outputs.write_text(tmp_path / name, "new")
    assert source.read_text() == "weights"


@pytest.mark.reliability("one-line-errors")
def test_folders_broken_paths_and_unwritable_places_are_named(tmp_path):
    (tmp_path / "folder").mkdir()
    write(tmp_path, "file", "x")
    outputs = Outputs("cmd", force=True)
    assert "folder: a folder (give the path of a file)" in outputs.in_the_way(tmp_path / "folder")
    assert "file is a file, not a folder" in outputs.in_the_way(tmp_path / "file" / "out.txt")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # root writes anywhere
            assert "is not writable" in outputs.in_the_way(locked / "out.txt")
    finally:
        locked.chmod(0o700)


def test_a_folder_replaced_whole_must_be_the_commands_own(tmp_path):
    """``check(replaced=...)``: a folder the command empties and fills again is refused like a
    file it did not make (``--force`` allows it); its own, and a new one, pass."""
    mine, theirs, new = tmp_path / "mine", tmp_path / "theirs", tmp_path / "new"
    mine.mkdir()
    write(theirs, "notes.txt", FOREIGN)
    Outputs("cmd", settings={"vocab": 1}).record(mine)
    outputs = Outputs("cmd")
    outputs.check([], replaced=[mine, new])
    with pytest.raises(OutputInTheWay, match=r"theirs: exists, not made by cmd; .*--force"):
        outputs.check([], replaced=[mine, theirs])
    Outputs("cmd", force=True).check([], replaced=[theirs])
    with pytest.raises(OutputInTheWay, match=r"notes.txt: a file, not a folder; choose another output$"):
        Outputs("cmd", force=True).check([], replaced=[theirs / "notes.txt"])
    assert (theirs / "notes.txt").read_text() == FOREIGN


@pytest.mark.reliability("one-line-errors")
def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    outputs = Outputs("cmd")
    target = outputs.write_text(tmp_path / "out.txt", "old")
    with pytest.raises(RuntimeError, match="boom"):
        with outputs.writing(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("boom")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "out.txt"]


def test_a_torch_write_that_cannot_open_its_file_names_the_path(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0 open file failed")

    monkeypatch.setattr(torch, "save", fail)
    with pytest.raises(OSError) as caught:
        Outputs("cmd").save({}, tmp_path / "model.pt")
    assert caught.value.filename == str(tmp_path / "model.pt") and caught.value.errno == errno.EACCES


@pytest.mark.reliability("one-run-per-output")
def test_one_holder_per_output_folder(tmp_path):
    with exclusive(tmp_path, "first --command"):
        with pytest.raises(Busy, match=r"in use by first --command \(pid \d+"):
            with exclusive(tmp_path, "second"):
                pass
        # another process sees the same lock (flock is per open file, not per process)
        with open(tmp_path / ".sret-lock") as handle:
            with pytest.raises(BlockingIOError):
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with exclusive(tmp_path, "second"):  # released when the holder ends
        pass


# ---------------------------------------------------------------- every writing command
@dataclass
class Writer:
    """A command that writes: ``setup`` makes its inputs in a folder, ``argv`` runs it with
    its outputs under ``out/``, ``outputs`` are the paths (relative to the folder) it writes."""

    command: str
    setup: Callable[[Path], None]
    argv: List[str]
    outputs: List[str]
    #: an argv whose output is one of the inputs (refused even with --force), if the command has inputs
    onto_input: List[str] = field(default_factory=list)


def fake_checkpoint(folder: Path, name: str, value: float, epoch: int = 1) -> None:
    """A fairseq-like checkpoint with one LRC coefficient (enough to average and to plot)."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"args": None, "model": {"encoder.layers.0.recursive.layer.ffn_residual.skip_scale": torch.tensor([value])},
                "optimizer_history": [{"num_updates": 10 * epoch}], "extra_state": {"train_iterator": {"epoch": epoch}}},
               folder / name)


def two_checkpoints(folder: Path) -> None:
    fake_checkpoint(folder / "run", "checkpoint1.pt", 1.0, 1)
    fake_checkpoint(folder / "run", "checkpoint2.pt", 3.0, 2)


GENERATE_OUTPUT = "".join(f"S-{i}\tw{i} w2\nT-{i}\tv2 v{i}\nH-{i}\t-0.5\tv2 v{i}\n" for i in range(3)) + \
    "Generate test with beam=2: BLEU4 = 100.00\n"


def generate_output(folder: Path) -> None:
    for lang in ("src", "tgt"):
        write(folder, f"bin/dict.{lang}.txt", "w1 1\n")
        for ext in ("idx", "bin"):
            write(folder, f"bin/test.src-tgt.{lang}.{ext}", "")
    write(folder, "gen/generate-test.txt", GENERATE_OUTPUT)
    write(folder, "gen/test.hyp", GENERATE_OUTPUT)  # named as an output of the scoring


def experiment_file(folder: Path) -> None:
    write(folder, "exp.yaml", "name: exp\ntrain: {args: --lr 1e-3, max_update: 2}\nrows:\n"
                              "  - {id: sret, arch: sret_transformer_tiny}\n")


def checkpoint_and_data_bin(folder: Path) -> None:
    """A data-bin made by sret-prepare's recipe (spm.model, dictionaries) and an sret_transformer
    checkpoint of it: what sret-export-hf reads."""
    from test_modeling import make_data_bin, sret_checkpoint

    sret_checkpoint(make_data_bin(folder), folder / "sret.pt")


VISION = ["--data", "images", "--model", "sret_ext", "--img-size", "32", "--batch-size", "4", "--workers", "0",
          "--epochs", "1", "--max-steps-per-epoch", "1", "--log-interval", "0", "--warmup-epochs", "0"]

WRITERS = [
    Writer("sret-toy-data", lambda f: None, ["sret-toy-data", "out"],
           [f"out/{s}.{side}" for s in ("train", "valid", "test") for side in ("src", "tgt")]),
    Writer("sret-prepare", corpus,
           ["sret-prepare", "multi30k", "--src", "raw", "--out", "out", "--vocab-size", "60"],
           ["out/dict.de.txt", "out/sret_data.json", "out/train.de-en.de.bin", "out/text/test.raw.en", "out/spm.model"],
           onto_input=["sret-prepare", "multi30k", "--src", "out", "--out", "out", "--vocab-size", "60"]),
    Writer("sret-average-checkpoints", two_checkpoints,
           ["sret-average-checkpoints", "--inputs", "run/checkpoint1.pt", "run/checkpoint2.pt", "--output", "out/avg.pt"],
           ["out/avg.pt"],
           onto_input=["sret-average-checkpoints", "--inputs", "run", "--num-epoch-checkpoints", "2", "--output",
                       "run/checkpoint2.pt"]),
    Writer("sret-plot-lrc", two_checkpoints, ["sret-plot-lrc", "run", "--output", "out/lrc.png"], ["out/lrc.png"],
           onto_input=["sret-plot-lrc", "run", "--output", "run/checkpoint1.pt"]),
    Writer("sret-uptrain", transformer_checkpoint, ["sret-uptrain", "transformer.pt", "out/sret.pt"], ["out/sret.pt"],
           onto_input=["sret-uptrain", "transformer.pt", "transformer.pt"]),
    Writer("sret-evaluate", generate_output,
           ["sret-evaluate", "--data", "bin", "--generate-output", "gen/generate-test.txt", "--output-dir", "out"],
           ["out/test.hyp", "out/test.results.json"],
           onto_input=["sret-evaluate", "--data", "bin", "--generate-output", "gen/test.hyp", "--output-dir", "gen"]),
    Writer("sret-train-vision", images, ["sret-train-vision", *VISION, "--output", "out"],
           ["out/checkpoint_best.pt", "out/checkpoint_last.pt", "out/log.jsonl"]),
    Writer("sret-export-hf", checkpoint_and_data_bin, ["sret-export-hf", "sret.pt", "--data-bin", "bin", "--out", "out"],
           ["out/config.json", "out/model.safetensors", "out/spm.model"],
           onto_input=["sret-export-hf", "sret.pt", "--data-bin", "bin", "--out", "bin"]),
    Writer("sret-experiments", experiment_file,
           ["sret-experiments", "exp.yaml", "--data", "bin", "--output", "runs", "--results", "out", "--report-only"],
           ["out/exp.json", "out/exp.md"]),
]
# what --dump-logits writes is another output of sret-train-vision, onto one of its inputs too
DUMP = Writer("sret-train-vision --dump-logits", images,
              ["sret-train-vision", "--data", "images", "--model", "sret_ext", "--img-size", "32", "--workers", "0",
               "--checkpoint", "weights.pt", "--dump-logits", "out/logits.pt"], ["out/logits.pt"],
              onto_input=["sret-train-vision", "--data", "images", "--model", "sret_ext", "--img-size", "32",
                          "--workers", "0", "--checkpoint", "weights.pt", "--dump-logits", "weights.pt"])


def vision_weights(folder: Path) -> None:
    from fairseq_sret.vision import create_model
    from fairseq_sret.vision.weights import save_checkpoint

    images(folder)
    save_checkpoint(create_model("sret_ext", num_classes=2, img_size=32), folder / "weights.pt")


DUMP.setup = vision_weights
MAINS.update({"sret-plot-lrc": "fairseq_sret_cli.plot_lrc", "sret-count": "fairseq_sret_cli.count"})


def test_the_table_lists_every_command_that_writes():
    text = (REPO / "setup.py").read_text()
    commands = set(re.findall(r'"(sret-[a-z-]+) = ', text))
    # sret-count prints, writes nothing; sret-train-cifar keeps one run per folder and refuses even
    # its own run without --resume or --force (tests/cli/test_train_cifar.py)
    assert commands - {w.command for w in WRITERS} == {"sret-count", "sret-train-cifar"}


def run(writer: Writer, folder: Path, argv: List[str]):
    from bad_input_cases import Case

    return run_case_here(Case(writer.command, "", argv, ""), folder)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): digest(p) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("writer", WRITERS + [DUMP], ids=[w.command for w in WRITERS] + ["sret-train-vision-dump"])
@pytest.mark.reliability("one-run-per-output")
def test_a_command_never_replaces_what_it_did_not_make(writer, tmp_path):
    if writer.command in TRANSLATION_COMMANDS and not HAVE_FAIRSEQ:
        pytest.skip(f"{writer.command} needs fairseq (pip install -e '.[fairseq]')")
    writer.setup(tmp_path)
    command = writer.argv[0]
    # every output is a file the user made, and one more beside them
    for name in writer.outputs:
        write(tmp_path, name, FOREIGN)
    beside = write(tmp_path, "out/notes.txt", FOREIGN)
    before = snapshot(tmp_path)
    rc, err, _ = run(writer, tmp_path, writer.argv)
    line = err.strip().splitlines()[-1]
    assert rc == 2 and line.startswith(f"{command}: error: ") and "--force" in line, err[-2000:]
    assert Path(writer.outputs[0]).name in line, line  # names what is in the way
    assert snapshot(tmp_path) == before

    # with --force: its outputs replaced, the file beside them untouched
    rc, err, _ = run(writer, tmp_path, writer.argv + ["--force"])
    assert rc == 0, err[-2000:]
    for name in writer.outputs:
        assert (tmp_path / name).read_text(errors="replace") != FOREIGN, name
    assert beside.read_text() == FOREIGN
    # a second run with the same settings refreshes its own outputs without --force
    # (sret-train-vision continues a run only with --resume: tested below)
    if writer.command != "sret-train-vision":
        rc, err, _ = run(writer, tmp_path, writer.argv)
        assert rc == 0, err[-2000:]
    assert beside.read_text() == FOREIGN

    if writer.onto_input:  # an input is never an output, not even with --force
        before = snapshot(tmp_path)
        rc, err, _ = run(writer, tmp_path, writer.onto_input + ["--force"])
        assert rc == 2 and "an input of this command" in err.strip().splitlines()[-1], err[-2000:]
        assert snapshot(tmp_path) == before


def test_sret_count_writes_nothing(tmp_path):
    from bad_input_cases import Case

    rc, _, changed = run_case_here(Case("sret-count", "", ["sret-count", "vision", "sret_ext", "--img-size", "32"], ""),
                                   tmp_path)
    assert rc == 0 and changed == []


@pytest.mark.reliability("one-run-per-output")
def test_a_second_vision_run_into_a_trained_folder_needs_resume_or_force(tmp_path):
    images(tmp_path)
    writer = WRITERS[[w.command for w in WRITERS].index("sret-train-vision")]
    assert run(writer, tmp_path, writer.argv)[0] == 0
    trained = snapshot(tmp_path / "out")
    rc, err, _ = run(writer, tmp_path, writer.argv)  # the same command again, without --resume
    assert rc == 2 and "out holds a run (checkpoint_best.pt, checkpoint_last.pt, log.jsonl): continue it with" \
        " --resume out/checkpoint_last.pt" in err, err[-2000:]
    assert snapshot(tmp_path / "out") == trained
    # resuming past --epochs trains nothing, and says so
    rc, err, _ = run(writer, tmp_path, writer.argv + ["--resume", "out/checkpoint_last.pt"])
    assert rc == 1 and "nothing to train (raise --epochs" in err, err[-2000:]
    argv = [a if a != "1" or writer.argv[i - 1] != "--epochs" else "2" for i, a in enumerate(writer.argv)]
    assert run(writer, tmp_path, argv + ["--resume", "out/checkpoint_last.pt"])[0] == 0
    log = (tmp_path / "out" / "log.jsonl").read_text().splitlines()
    assert len(log) == 2 and '"epoch": 1' in log[1]  # one history, continued


@requires_fairseq
def test_prepare_puts_a_data_bin_beside_the_corpus_it_reads(tmp_path):
    """``--src myproject/raw --out myproject`` once deleted the whole project, corpus included."""
    corpus(tmp_path)
    project = tmp_path / "myproject"
    shutil.move(tmp_path / "raw", project / "raw")
    notes = write(project, "notes.txt", FOREIGN)
    corpus_before = snapshot(project / "raw")
    writer = WRITERS[1]
    argv = ["sret-prepare", "multi30k", "--src", "myproject/raw", "--out", "myproject", "--vocab-size", "60"]
    rc, err, _ = run(writer, tmp_path, argv)
    assert rc == 0, err[-2000:]
    assert notes.read_text() == FOREIGN and snapshot(project / "raw") == corpus_before
    assert (project / "sret_data.json").is_file() and not list(project.glob(".sret-prepare*"))
    import json

    options = json.loads((project / "sret_data.json").read_text())["options"]
    dictionary = len((project / "dict.de.txt").read_text().splitlines())
    # the vocabulary a small corpus gives, not the one asked for
    assert options["requested_vocab_size"] == 60 and options["vocab_size"] < 60
    assert options["dictionary_size"] == dictionary + 4
    # another vocabulary over it: refused, then with --force only the data-bin's files change
    rc, err, _ = run(writer, tmp_path, argv[:-1] + ["50"])
    assert rc == 2 and "made by sret-prepare with other settings (vocab_size=60; now vocab_size=50)" in err, err
    rc, err, _ = run(writer, tmp_path, argv[:-1] + ["50", "--force"])
    assert rc == 0 and notes.read_text() == FOREIGN and snapshot(project / "raw") == corpus_before, err[-2000:]
    assert json.loads((project / "sret_data.json").read_text())["options"]["requested_vocab_size"] == 50
    # `--out .` once failed ("Device or resource busy") and left a hidden partial data-bin
    rc, err, _ = run(writer, project, ["sret-prepare", "multi30k", "--src", "raw", "--out", ".", "--vocab-size", "40",
                                       "--force"])
    assert rc == 0 and notes.read_text() == FOREIGN and snapshot(project / "raw") == corpus_before, err[-2000:]
    assert not [p for p in project.iterdir() if p.name.startswith(".sret-prepare")]


@requires_fairseq
def test_prepare_downloads_into_a_users_folder_only_with_force(tmp_path):
    """An archive as ``--src`` is unpacked into ``OUT/orig``; a user's own ``orig`` is not taken over."""
    import tarfile

    corpus(tmp_path)
    with tarfile.open(tmp_path / "raw.tgz", "w:gz") as archive:
        archive.add(tmp_path / "raw", arcname="raw")
    notes = write(tmp_path, "project/orig/notes.txt", FOREIGN)
    argv = ["sret-prepare", "multi30k", "--src", "raw.tgz", "--out", "project", "--vocab-size", "60"]
    writer = WRITERS[1]
    before = snapshot(tmp_path)
    rc, err, _ = run(writer, tmp_path, argv)
    assert rc == 2 and "project/orig: exists, not made by sret-prepare; give another --work-dir" in err, err[-2000:]
    assert snapshot(tmp_path) == before
    rc, err, _ = run(writer, tmp_path, argv + ["--force"])
    assert rc == 0 and (tmp_path / "project" / "sret_data.json").is_file(), err[-2000:]
    assert notes.read_text() == FOREIGN
    # the folder is its own now: a data-bin built again (here: after the user deleted it) uses it without --force
    for path in (tmp_path / "project").iterdir():
        if path.name not in ("orig", ".sret-outputs.json"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    rc, err, _ = run(writer, tmp_path, argv)
    assert rc == 0 and (tmp_path / "project" / "sret_data.json").is_file(), err[-2000:]
    assert notes.read_text() == FOREIGN
