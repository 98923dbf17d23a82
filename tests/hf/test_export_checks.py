"""An exported folder is checked against what it was made from: the SentencePiece model
against the dictionaries at export, the tokenizer files against the fingerprints the folder
records when it loads, the checkpoint bench_hf compares with against the one it records; an
average's inputs travel into the record. A folder exported before the fingerprints were
recorded loads as before."""

import json
import logging
import shutil

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("fairseq")

import fairseq_sret.hf  # noqa: E402,F401
from fairseq_sret.checkpoints import average_checkpoints  # noqa: E402
from fairseq_sret.hf.convert import MARKER, ExportError, export_checkpoint  # noqa: E402
from fairseq_sret_cli.data import multi30k  # noqa: E402
from fairseq_sret_cli.export_hf import main as export_main  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline  # noqa: E402
from test_modeling import make_data_bin, sret_checkpoint, write_toy_multi30k  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")
SOURCES = ["Hund läuft über dem Ball.", "Katze schläft."]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(tmp_path_factory.mktemp("bin"))


@pytest.fixture(scope="module")
def other_spm(tmp_path_factory):
    """The spm.model of other sret-prepare runs on the same corpus: fewer pieces, and more
    (a larger BPE model holds every piece of a smaller one)."""
    root = tmp_path_factory.mktemp("other")
    raw = write_toy_multi30k(root / "raw")
    return {size: multi30k.prepare(root / f"bin{size}", src=raw, vocab_size=size) / "spm.model" for size in (50, 110)}


@pytest.fixture(scope="module")
def checkpoint(data_bin, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint.pt"
    sret_checkpoint(data_bin, path)
    return path


@pytest.fixture(scope="module")
def exported(checkpoint, data_bin, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "exported"
    export_checkpoint(checkpoint, data_bin, folder)
    return folder


def copy_of(folder, tmp_path, name="copy"):
    target = tmp_path / name
    shutil.copytree(folder, target)
    return target


def swap_two_lines(path):
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join([lines[5], *lines[1:5], lines[0], *lines[6:]]), encoding="utf-8")


# ---------------------------------------------------------------- at export
@pytest.mark.parametrize("size", [50, 110])
@pytest.mark.parametrize("holds", ["everything", "no text", "no text and no sret_data.json"])
@pytest.mark.reliability("tied-to-inputs")
def test_an_export_refuses_the_sentencepiece_model_of_another_preparation(
        size, holds, checkpoint, data_bin, other_spm, tmp_path, capsys):
    """Whatever the data-bin still holds of its preparation (its text, its record), a
    SentencePiece model that is not the one its dictionaries were made with is refused, naming
    the file: the export would cut text into other pieces than the model was trained on."""
    mixed = copy_of(data_bin, tmp_path)
    shutil.copyfile(other_spm[size], mixed / "spm.model")
    if holds != "everything":
        shutil.rmtree(mixed / "text")
    if holds == "no text and no sret_data.json":
        (mixed / "sret_data.json").unlink()
        if size == 110:  # every dictionary symbol is a piece of the larger model: nothing left to tell
            pytest.skip("a larger model of the same corpus needs the data-bin's text or record to be told apart")
    code = export_main([str(checkpoint), "--data-bin", str(mixed), "--out", str(tmp_path / "out")])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1 and line.startswith(f"sret-export-hf: error: {mixed / 'spm.model'}: "), line
    assert not (tmp_path / "out").exists()


def test_the_data_bins_own_model_exports_with_the_fingerprints_of_its_files(exported, checkpoint):
    from fairseq_sret.hf.convert import check_exported_from

    config = json.loads((exported / "config.json").read_text())
    tokenizer_config = json.loads((exported / "tokenizer_config.json").read_text())
    assert set(config["tokenizer_fingerprints"]) == {"spm.model", "dict.source.txt", "dict.target.txt"}
    assert tokenizer_config["tokenizer_fingerprints"] == config["tokenizer_fingerprints"]
    record = json.loads((exported / MARKER).read_text())
    assert check_exported_from(exported, checkpoint) == record and "averaged_from" not in record


# ---------------------------------------------------------------- at load
CHANGES = {
    "spm.model replaced": lambda folder, spm: shutil.copyfile(spm, folder / "spm.model"),
    "dict.source.txt lines swapped": lambda folder, spm: swap_two_lines(folder / "dict.source.txt"),
    "dict.target.txt lines swapped": lambda folder, spm: swap_two_lines(folder / "dict.target.txt"),
}
LOADERS = {
    "tokenizer": lambda folder: AutoTokenizer.from_pretrained(folder),
    "model": lambda folder: AutoModelForSeq2SeqLM.from_pretrained(folder),
    "pipeline": lambda folder: pipeline("sret-translation", model=str(folder)),
}


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.reliability("tied-to-inputs")
def test_a_folder_whose_tokenizer_files_changed_does_not_load(change, loader, exported, other_spm, tmp_path):
    folder = copy_of(exported, tmp_path)
    CHANGES[change](folder, other_spm[110])
    name = change.split()[0]
    with pytest.raises(ValueError) as error:
        LOADERS[loader](folder)
    message = str(error.value)
    assert message.startswith(f"{folder / name}: not the {name} this folder was exported with") and "\n" not in message


def test_the_same_dictionaries_saved_with_windows_line_ends_still_load(exported, tmp_path):
    folder = copy_of(exported, tmp_path)
    path = folder / "dict.source.txt"
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    AutoTokenizer.from_pretrained(folder)
    AutoModelForSeq2SeqLM.from_pretrained(folder)


@pytest.mark.reliability("tied-to-inputs")
def test_a_folder_exported_before_fingerprints_loads_as_before_with_one_warning(exported, tmp_path, caplog):
    old = copy_of(exported, tmp_path)
    for name in ("config.json", "tokenizer_config.json"):
        settings = json.loads((old / name).read_text())
        del settings["tokenizer_fingerprints"]
        (old / name).write_text(json.dumps(settings))
    swap_two_lines(old / "dict.target.txt")  # cannot be told: nothing recorded
    with caplog.at_level(logging.WARNING):
        translate = pipeline("sret-translation", model=str(old))
        AutoModelForSeq2SeqLM.from_pretrained(old)
    warnings = [r.getMessage() for r in caplog.records if "cannot be checked" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(f"{old}: exported before")
    assert len(translate(SOURCES, max_new_tokens=5)) == 2


# ---------------------------------------------------------------- provenance
@pytest.mark.reliability("tied-to-inputs")
def test_bench_hf_refuses_an_export_of_another_checkpoint(exported, checkpoint, data_bin, tmp_path, capsys):
    from benchmarks import bench_hf
    from fairseq_sret.hf.convert import check_exported_from

    other = tmp_path / "other.pt"
    sret_checkpoint(data_bin, other, seed=1)
    with pytest.raises(ExportError, match="was exported from another checkpoint than"):
        check_exported_from(exported, other)
    with pytest.raises(SystemExit) as exit_info:
        bench_hf.main(["--checkpoint", str(other), "--data-bin", str(data_bin), "--exported", str(exported)])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and line.startswith("python -m benchmarks.bench_hf: error: --exported: ")
    moved = tmp_path / "moved.pt"  # the same file elsewhere is the same checkpoint
    shutil.copyfile(checkpoint, moved)
    check_exported_from(exported, moved)


@pytest.mark.reliability("metadata-survives")
def test_an_export_of_an_average_records_its_inputs(checkpoint, data_bin, tmp_path):
    second = tmp_path / "checkpoint2.pt"
    sret_checkpoint(data_bin, second, seed=3)
    average = tmp_path / "avg.pt"
    torch.save(average_checkpoints([checkpoint, second]), average)
    record = export_checkpoint(average, data_bin, tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / MARKER).read_text())
    assert [entry["path"] for entry in saved["averaged_from"]] == [str(checkpoint.resolve()), str(second.resolve())]
    assert record["averaged_from"] == saved["averaged_from"]
