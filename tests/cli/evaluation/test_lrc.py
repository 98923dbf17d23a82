"""LRC coefficient trajectories (fairseq_sret_cli.evaluation.lrc, sret-plot-lrc) on a synthetic run."""

import argparse
import collections
import importlib
import sys
from pathlib import Path

import pytest
import torch

from fairseq_sret_cli.evaluation import lrc

NAMES = [
    "encoder.layers.0.recursive.layer.self_attn_residual.skip_scale",
    "encoder.layers.0.recursive.layer.self_attn_residual.branch_scale",
    "encoder.layers.0.recursive.nlls.0.residual.skip_scale",
    "decoder.layers.1.recursive.layer.ffn_residual.branch_scale",
]


def value(name_index: int, updates: int) -> float:
    return 1.0 + 0.001 * updates * (name_index + 1) * (-1) ** name_index


def write_run(folder: Path, updates=(100, 200, 300)):
    for epoch, u in enumerate(updates, 1):
        model = collections.OrderedDict((n, torch.tensor([value(i, u)])) for i, n in enumerate(NAMES))
        model["encoder.layers.0.fc1.weight"] = torch.zeros(2, 2)
        state = {"args": argparse.Namespace(arch="sret"), "model": model,
                 "optimizer_history": [{"num_updates": u}], "extra_state": {"train_iterator": {"epoch": epoch}}}
        torch.save(state, folder / f"checkpoint{epoch}.pt")
        torch.save(state, folder / f"checkpoint_{epoch}_{u}.pt")
    torch.save(state, folder / "checkpoint_last.pt")
    torch.save(state, folder / "checkpoint_best.pt")
    torch.save({"model": {}}, folder / "checkpoint.avg5.pt")  # not part of the run's history


def test_collect_orders_and_deduplicates(tmp_path):
    write_run(tmp_path)
    traj = lrc.collect(lrc.run_checkpoints(tmp_path))
    assert traj.updates == [100, 200, 300] and traj.epochs == [1, 2, 3]
    assert list(traj.values) == NAMES
    for i, name in enumerate(NAMES):
        assert traj.values[name] == pytest.approx([value(i, u) for u in (100, 200, 300)])
    assert not any(f.endswith("checkpoint_last.pt") for f in traj.files)


def test_layers_and_labels():
    groups = lrc.by_layer(NAMES)
    assert list(groups) == ["encoder.layers.0", "decoder.layers.1"]
    assert [label for label, _ in groups["encoder.layers.0"]] == ["self_attn.skip", "self_attn.branch", "nlls.0.skip"]
    assert [label for label, _ in groups["decoder.layers.1"]] == ["ffn.branch"]


def test_table(tmp_path):
    write_run(tmp_path)
    table = lrc.format_table(lrc.collect(lrc.run_checkpoints(tmp_path)))
    assert "encoder.layers.0" in table and "self_attn.skip" in table
    row = next(line for line in table.splitlines() if line.strip().startswith("300"))
    assert f"{value(0, 300):.4f}" in row and f"{value(1, 300):.4f}" in row


def test_no_lrc_parameters_is_a_clear_error(tmp_path):
    torch.save({"model": {"w": torch.zeros(1)}, "optimizer_history": [{"num_updates": 1}]}, tmp_path / "checkpoint1.pt")
    with pytest.raises(ValueError, match="skip_scale"):
        lrc.collect([tmp_path / "checkpoint1.pt"])


def load_script(name="plot_lrc"):
    return importlib.import_module(f"fairseq_sret_cli.{name}")


def test_cli_prints_a_table_without_matplotlib(tmp_path, monkeypatch, capsys):
    write_run(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert load_script().main([str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "decoder.layers.1" in captured.out and "ffn.branch" in captured.out
    assert "matplotlib is not installed" in captured.err
    assert not (tmp_path / "lrc.png").exists()


def test_cli_plots_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path)
    assert load_script().main([str(tmp_path), "--output", str(tmp_path / "out.png")]) == 0
    assert (tmp_path / "out.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.reliability("inputs-as-they-seem")
def test_cli_writes_the_format_its_output_names(tmp_path):
    pytest.importorskip("matplotlib")
    write_run(tmp_path)
    assert load_script().main([str(tmp_path), "--output", str(tmp_path / "lrc.pdf")]) == 0
    assert (tmp_path / "lrc.pdf").read_bytes()[:5] == b"%PDF-"
    assert load_script().main([str(tmp_path), "--output", str(tmp_path / "lrc.svg")]) == 0
    assert b"<svg" in (tmp_path / "lrc.svg").read_bytes()[:500]
    with pytest.raises(SystemExit):  # a format it cannot write is refused, not written as PNG
        load_script().main([str(tmp_path), "--output", str(tmp_path / "lrc.jpeg")])
    assert not (tmp_path / "lrc.jpeg").exists()


@pytest.mark.reliability("inputs-as-they-seem")
def test_run_folders_among_several_inputs_are_read_and_one_given_twice_is_named(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_run(tmp_path / name)
    # two run folders: the checkpoints of both, not a folder read as a checkpoint file
    assert load_script().main([str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(tmp_path / "ab.png")]) == 0
    first = tmp_path / "a" / "checkpoint1.pt"
    for twice in ([tmp_path / "a", tmp_path / "a"], [tmp_path / "a", first]):
        capsys.readouterr()
        with pytest.raises(SystemExit):
            load_script().main([*map(str, twice), "--output", str(tmp_path / "twice.png")])
        assert "is given twice" in capsys.readouterr().err
    assert not (tmp_path / "twice.png").exists()
