"""sret-export-hf: what it writes, what it refuses, and its one-line errors."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("fairseq")

from fairseq_sret_cli.export_hf import main  # noqa: E402
from fairseq_sret.hf.convert import MARKER  # noqa: E402
from test_modeling import make_data_bin, sret_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(tmp_path_factory.mktemp("cli_toy"))


@pytest.fixture(scope="module")
def checkpoint(data_bin, tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_ckpt") / "checkpoint.pt"
    sret_checkpoint(data_bin, path, encoder_groups="2,1")
    return path


def export(capsys, *argv):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    return code, (err[-1] if err else "")


def test_writes_a_folder_it_may_replace(checkpoint, data_bin, tmp_path, capsys):
    out = tmp_path / "hf"
    code, line = export(capsys, checkpoint, "--data-bin", data_bin, "--out", out)
    assert code == 0 and line.startswith(f"wrote {out}: de->en")
    assert {"config.json", "generation_config.json", "model.safetensors", "spm.model", "dict.source.txt",
            "dict.target.txt", "tokenizer_config.json", MARKER} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "config.json").read_text())["model_type"] == "sret_transformer"
    first = (out / "model.safetensors").read_bytes()
    assert export(capsys, checkpoint, "--data-bin", data_bin, "--out", out)[0] == 0  # its own folder: replaced
    assert (out / "model.safetensors").read_bytes() == first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left behind


def test_refuses_what_it_did_not_make_unless_forced(checkpoint, data_bin, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "config.json").write_text("{}")
    code, line = export(capsys, checkpoint, "--data-bin", data_bin, "--out", out)
    assert code == 2 and "config.json" in line and "--force" in line
    assert (out / "config.json").read_text() == "{}" and sorted(p.name for p in out.iterdir()) == [
        "config.json", "notes.txt"]
    assert export(capsys, checkpoint, "--data-bin", data_bin, "--out", out, "--force")[0] == 0
    assert (out / "notes.txt").read_text() == "keep me" and (out / MARKER).is_file()  # files beside stay
    assert json.loads((out / "config.json").read_text())["model_type"] == "sret_transformer"


@pytest.mark.reliability("one-run-per-output")
def test_refuses_to_write_over_its_inputs(checkpoint, data_bin, capsys):
    spm = (data_bin / "spm.model").read_bytes()
    code, line = export(capsys, checkpoint, "--data-bin", data_bin, "--out", data_bin, "--force")
    assert code == 2 and "an input of this command" in line
    assert (data_bin / "spm.model").read_bytes() == spm and not (data_bin / "config.json").exists()


def test_usage_errors_exit_2(checkpoint, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(checkpoint), "--out", "x"])
    assert exc.value.code == 2 and "--data-bin" in capsys.readouterr().err


def corrupt(path, tmp_path):
    broken = tmp_path / "broken.pt"
    broken.write_bytes(path.read_bytes()[:2000])
    return broken


def foreign(path, tmp_path):
    other = tmp_path / "vision.pt"
    torch.save({"model": {"head.weight": torch.zeros(2, 2)}, "epoch": 3}, other)
    return other


def transformer(path, tmp_path):
    state = torch.load(path, weights_only=False)
    state["cfg"]["model"].arch = state["cfg"]["model"]._name = "transformer"
    other = tmp_path / "transformer.pt"
    torch.save(state, other)
    return other


def adaptive_softmax(path, tmp_path):
    state = torch.load(path, weights_only=False)
    state["cfg"]["model"].adaptive_softmax_cutoff = "10,20"
    other = tmp_path / "adaptive.pt"
    torch.save(state, other)
    return other


def wrong_layers(path, tmp_path):
    state = torch.load(path, weights_only=False)
    state["cfg"]["model"].encoder_layers = 3
    other = tmp_path / "layers.pt"
    torch.save(state, other)
    return other


@pytest.mark.parametrize("make,message", [
    (lambda path, tmp_path: tmp_path / "missing.pt", "no such checkpoint file"),
    (corrupt, "is truncated or corrupted"),
    (foreign, "not a fairseq translation checkpoint (no model options"),
    (transformer, "holds a 'transformer' model; sret-export-hf exports sret_transformer models (convert a fairseq"
                  " transformer with sret-uptrain first)"),
    (adaptive_softmax, "--adaptive-softmax-cutoff is not supported"),
    (wrong_layers, "the weights do not fit the model its options describe: 32 missing (e.g. model.encoder.layers.2."),
])
def test_bad_checkpoints_give_one_line(make, message, checkpoint, data_bin, tmp_path, capsys):
    code, line = export(capsys, make(checkpoint, tmp_path), "--data-bin", data_bin, "--out", tmp_path / "out")
    assert code == 1 and line.startswith("sret-export-hf: error: ") and message in line
    assert not (tmp_path / "out").exists()


def test_bad_data_bins_give_one_line(checkpoint, data_bin, tmp_path, capsys):
    no_spm = tmp_path / "no_spm"
    shutil.copytree(data_bin, no_spm)
    (no_spm / "spm.model").unlink()
    code, line = export(capsys, checkpoint, "--data-bin", no_spm, "--out", tmp_path / "a")
    assert code == 1 and "has no spm.model" in line
    swapped = tmp_path / "swapped"
    shutil.copytree(data_bin, swapped)
    lines = (swapped / "dict.de.txt").read_text().splitlines(keepends=True)
    (swapped / "dict.de.txt").write_text("".join([lines[1], lines[0], *lines[2:]]))
    code, line = export(capsys, checkpoint, "--data-bin", swapped, "--out", tmp_path / "b")
    assert code == 1 and "dict.de.txt: not the source dictionary" in line
    code, line = export(capsys, checkpoint, "--data-bin", tmp_path / "nowhere", "--out", tmp_path / "c")
    assert code == 1 and "no such data-bin folder" in line


@pytest.mark.e2e
def test_the_console_script_runs(checkpoint, data_bin, tmp_path):
    result = subprocess.run([sys.executable, "-m", "fairseq_sret_cli.export_hf", str(checkpoint), "--data-bin",
                             str(data_bin), "--out", str(tmp_path / "hf")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "hf" / "model.safetensors").is_file()
