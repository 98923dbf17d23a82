"""Checkpoint averaging (fairseq_sret.checkpoints, sret-average-checkpoints) on synthetic
fairseq-style checkpoints."""

import argparse
import collections
import importlib
from pathlib import Path

import pytest
import torch

from fairseq_sret.checkpoints import (
    average_checkpoints, checkpoint_num_updates, last_n_checkpoints, load_checkpoint, save_checkpoint,
)



def fake_checkpoint(seed: int, epoch: int, updates: int, run_seed: int = 1) -> dict:
    """A checkpoint of the run of seed ``run_seed`` at ``epoch``; ``seed`` draws its weights."""
    g = torch.Generator().manual_seed(seed)
    model = collections.OrderedDict(
        [
            ("encoder.embed_tokens.weight", torch.randn(5, 4, generator=g)),
            ("encoder.layers.0.fc1.bias", torch.randn(4, generator=g)),
            ("decoder.half", torch.randn(3, generator=g).half()),
            ("decoder.version", torch.tensor([seed + 1], dtype=torch.int64)),
        ]
    )
    return {
        "args": argparse.Namespace(arch="transformer", seed=run_seed, epoch_tag=epoch),
        "cfg": {"common": {"seed": run_seed}},
        "model": model,
        "criterion": None,
        "optimizer_history": [{"criterion_name": "X", "optimizer_name": "Adam", "num_updates": updates}],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": epoch}, "val_loss": 3.0 - epoch},
        "last_optimizer_state": {"state": {}, "param_groups": [{"lr": 1e-3}]},
    }


@pytest.fixture
def run_dir(tmp_path):
    for epoch in (1, 2, 3, 9, 10):
        torch.save(fake_checkpoint(epoch, epoch, 100 * epoch), tmp_path / f"checkpoint{epoch}.pt")
        torch.save(fake_checkpoint(epoch, epoch, 100 * epoch), tmp_path / f"checkpoint_{epoch}_{100 * epoch}.pt")
    torch.save(fake_checkpoint(10, 10, 1000), tmp_path / "checkpoint_last.pt")
    return tmp_path


def test_last_n_checkpoints_numeric_order(run_dir):
    assert [p.name for p in last_n_checkpoints(run_dir, 3)] == ["checkpoint10.pt", "checkpoint9.pt", "checkpoint3.pt"]
    assert [p.name for p in last_n_checkpoints(run_dir, 2, by="update")] == ["checkpoint_10_1000.pt", "checkpoint_9_900.pt"]
    assert [p.name for p in last_n_checkpoints(run_dir, 2, upper_bound=3)] == ["checkpoint3.pt", "checkpoint2.pt"]
    with pytest.raises(ValueError):
        last_n_checkpoints(run_dir, 6)


def test_average_is_the_mean_and_keeps_the_newest_metadata(run_dir):
    paths = last_n_checkpoints(run_dir, 3)
    avg = average_checkpoints(paths)
    states = [fake_checkpoint(s, s, 100 * s) for s in (10, 9, 3)]
    for key in ("encoder.embed_tokens.weight", "encoder.layers.0.fc1.bias"):
        expected = torch.stack([s["model"][key] for s in states]).mean(0)
        assert torch.allclose(avg["model"][key], expected, atol=1e-6)
        assert avg["model"][key].dtype == torch.float32
    half = torch.stack([s["model"]["decoder.half"].double() for s in states]).mean(0)
    assert avg["model"]["decoder.half"].dtype == torch.float16
    assert torch.allclose(avg["model"]["decoder.half"].double(), half, atol=1e-2)
    assert avg["model"]["decoder.version"].tolist() == [(11 + 10 + 4) // 3]  # integer tensors: floor of the mean
    assert checkpoint_num_updates(avg) == 1000 and avg["extra_state"]["train_iterator"]["epoch"] == 10
    assert avg["args"].epoch_tag == 10
    # a single checkpoint averages to itself
    one = average_checkpoints(last_n_checkpoints(run_dir, 1))
    assert torch.equal(one["model"]["encoder.layers.0.fc1.bias"], fake_checkpoint(10, 10, 1000)["model"]["encoder.layers.0.fc1.bias"])


def test_saved_average_loads_with_weights_only(run_dir, tmp_path):
    out = save_checkpoint(average_checkpoints(last_n_checkpoints(run_dir, 2)), tmp_path / "avg" / "avg.pt")
    state = load_checkpoint(out)
    assert isinstance(state["args"], argparse.Namespace)
    assert set(state["model"]) == set(fake_checkpoint(0, 0, 0)["model"])


def test_mismatched_checkpoints_are_rejected(tmp_path):
    a, b = fake_checkpoint(1, 1, 1), fake_checkpoint(2, 2, 2)
    b["model"]["encoder.layers.0.fc1.bias"] = torch.zeros(7)
    torch.save(a, tmp_path / "a.pt")
    torch.save(b, tmp_path / "b.pt")
    with pytest.raises(ValueError, match="shape"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])


def test_checkpoints_with_different_attention_layers_are_not_averaged(tmp_path):
    """The same parameters computed by another attention layer are another model."""
    a, b = fake_checkpoint(1, 1, 1), fake_checkpoint(2, 1, 2)
    a["args"].attention_layer, b["args"].attention_layer = "sliced_group", "local_window"
    torch.save(a, tmp_path / "a.pt")
    torch.save(b, tmp_path / "b.pt")
    with pytest.raises(ValueError, match="another kind of model .*attention_layer 'local_window' against 'sliced_group'"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])


class NotAllowed:
    pass


def test_unknown_globals_are_refused_not_unpickled(tmp_path):
    state = fake_checkpoint(1, 1, 1)
    state["extra_state"]["thing"] = NotAllowed()
    torch.save(state, tmp_path / "bad.pt")
    with pytest.raises(RuntimeError, match="allow-listed"):
        load_checkpoint(tmp_path / "bad.pt")


def load_script(name="average_checkpoints"):
    return importlib.import_module(f"fairseq_sret_cli.{name}")


def test_average_checkpoints_cli(run_dir, tmp_path, capsys):
    script = load_script("average_checkpoints")
    out = tmp_path / "avg.pt"
    assert script.main(["--inputs", str(run_dir), "--num-update-checkpoints", "2", "--output", str(out)]) == 0
    avg = load_checkpoint(out)
    expected = (fake_checkpoint(10, 10, 1000)["model"]["encoder.layers.0.fc1.bias"]
                + fake_checkpoint(9, 9, 900)["model"]["encoder.layers.0.fc1.bias"]) / 2
    assert torch.allclose(avg["model"]["encoder.layers.0.fc1.bias"], expected, atol=1e-6)
    files = [str(run_dir / "checkpoint1.pt"), str(run_dir / "checkpoint2.pt")]
    # another average over the first one: refused (the rule of every command that writes), then replaced
    assert script.main(["--inputs", *files, "--output", str(out)]) == 2
    assert script.main(["--inputs", *files, "--output", str(out), "--force"]) == 0
    assert checkpoint_num_updates(load_checkpoint(out)) == 200  # metadata of the newest input
