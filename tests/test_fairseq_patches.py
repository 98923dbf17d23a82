"""The fixes of fairseq_sret.fairseq_patches: each defect shown on the installed fairseq
without the patch, and gone with it; importing the pure-PyTorch parts changes nothing."""

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fairseq_cli.train
import fairseq_sret.models  # noqa: F401  (applies the patches)
from fairseq import checkpoint_utils
from fairseq.data import data_utils
from fairseq.models import distributed_fairseq_model
from fairseq_sret import fairseq_patches
from fairseq_sret.nmt_checkpoints import CorruptCheckpointError, load_checkpoint

from cli_helpers import ENV, SRET, TRAIN, preprocess, write_corpus


def test_every_patch_was_needed_and_applied():
    assert fairseq_patches.APPLIED == {p.name: "applied" for p in fairseq_patches.PATCHES}


def test_batch_by_size_defect_without_the_patch():
    original = data_utils.batch_by_size.__wrapped__
    assert fairseq_patches.batch_by_size_drops_examples(original)
    assert not fairseq_patches.batch_by_size_drops_examples(data_utils.batch_by_size)


@pytest.mark.parametrize("n", [1, 7, 60, 6750])
@pytest.mark.parametrize("max_tokens,max_sentences", [(None, 32), (4096, None), (300, 16)])
def test_batch_by_size_keeps_every_example(n, max_tokens, max_sentences):
    sizes = np.sort(np.random.default_rng(n).integers(3, 40, n))
    batches = data_utils.batch_by_size(
        np.arange(n), num_tokens_fn=lambda i: sizes[i], num_tokens_vec=sizes,
        max_tokens=max_tokens, max_sentences=max_sentences, required_batch_size_multiple=8,
    )
    flat = np.concatenate([np.asarray(b) for b in batches])
    assert sorted(flat.tolist()) == list(range(n))


def test_checkpoint_loading_defect_without_the_patch(tmp_path):
    original = checkpoint_utils.load_checkpoint_to_cpu.__wrapped__
    assert fairseq_patches.fairseq_loader_fails_on_own_checkpoints(original)
    assert not fairseq_patches.fairseq_loader_fails_on_own_checkpoints(checkpoint_utils.load_checkpoint_to_cpu)
    path = tmp_path / "ckpt.pt"
    state = {
        "args": None, "cfg": None, "model": {"w": torch.ones(2)},
        "optimizer_history": [{"num_updates": 3, "optimizer_name": "adam", "lr_scheduler_state": {}}],
        "extra_state": {"train_iterator": None, "run": argparse.Namespace(arch="sret_transformer")},
    }
    torch.save(state, path)
    with pytest.raises(Exception, match="Weights only load failed"):
        original(str(path))
    assert checkpoint_utils.load_checkpoint_to_cpu(str(path))["extra_state"]["run"].arch == "sret_transformer"
    # the allow-list is scoped to the call: nothing is allowed process-wide
    assert argparse.Namespace not in torch.serialization.get_safe_globals()
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CorruptCheckpointError, match=str(path)):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))


def test_cpu_ddp_defect_without_the_patch(monkeypatch):
    assert distributed_fairseq_model.DistributedDataParallel is fairseq_patches.CPUFriendlyDistributedDataParallel
    monkeypatch.setattr(distributed_fairseq_model, "DistributedDataParallel", torch.nn.parallel.DistributedDataParallel)
    assert fairseq_patches.fairseq_ddp_passes_device_ids_for_cpu()
    assert distributed_fairseq_model.DistributedDataParallel is torch.nn.parallel.DistributedDataParallel


@pytest.mark.e2e
@pytest.mark.parametrize("module", ["fairseq_sret", "fairseq_sret.core", "fairseq_sret.vision", "fairseq_sret.nmt_checkpoints"])
def test_pure_pytorch_parts_import_neither_fairseq_nor_its_patches(module):
    code = (
        f"import sys; import {module}; "
        "assert 'fairseq' not in sys.modules and 'fairseq_sret.fairseq_patches' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith('fairseq'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_finished_run_defect_without_the_patch():
    assert fairseq_patches.finished_run_trains_again(fairseq_cli.train.train.__wrapped__)
    assert not fairseq_patches.finished_run_trains_again(fairseq_cli.train.train)


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", ["fairseq-train", "python -m fairseq_cli.train"])
def test_a_finished_run_started_again_keeps_its_checkpoint(launcher, tmp_path):
    data_bin = preprocess(write_corpus(tmp_path / "raw", sizes=(("train", 60), ("valid", 10), ("test", 10))))
    program = [str(Path(sys.executable).parent / "fairseq-train")] if launcher == "fairseq-train" \
        else [sys.executable, "-m", "fairseq_cli.train"]
    argv = [*program, str(data_bin), *SRET, *TRAIN, "--max-update", "6", "--save-dir", str(tmp_path / "ckpt")]
    last = tmp_path / "ckpt" / "checkpoint_last.pt"

    def updates():
        return load_checkpoint(last)["optimizer_history"][-1]["num_updates"]

    subprocess.run(argv, env=ENV, check=True, capture_output=True, text=True, timeout=300)
    assert updates() == 6
    before = last.read_bytes()
    again = subprocess.run(argv, env=ENV, check=True, capture_output=True, text=True, timeout=300)
    assert "no further training" in again.stdout + again.stderr
    assert updates() == 6 and last.read_bytes() == before
