"""Extremely deep recursion, the CI-sized version of benchmarks/deep_recursion.py.

The 1000-layer run and its memory figures are in docs/benchmarks/memory.md; here a 100-layer
model (5 unique layers x 10 recursions per side) trains with finite, falling loss, and
activation checkpointing keeps a step's memory near one application's activations.
"""

import pytest
import torch

from benchmarks import deep_recursion
from nmt_helpers import SMALL, build

pytestmark = pytest.mark.slow

DEEP = ["--unique-layers", "5", "--recursions", "10", "--width", "32", "--batch", "4", "--length", "12"]


def test_100_layer_model_trains_with_finite_falling_loss():
    args = deep_recursion.parse_args([*DEEP, "--updates", "16", "--lr", "1e-3", "--checkpoint-recursions"])
    result = deep_recursion.train(args)
    assert result["updates"] == 16
    assert result["finite"] and result["falling"], result["losses"]


def test_checkpointing_keeps_step_memory_flat_in_depth():
    peaks = {}
    for checkpoint in (False, True):
        flags = ["--checkpoint-recursions"] if checkpoint else []
        args = deep_recursion.parse_args([*DEEP, "--recursions", "20", *flags])
        peaks[checkpoint] = deep_recursion.measure_child(args)["torch_step_peak_mib"]
    # without checkpointing every one of the 200 applications keeps its activations
    assert peaks[True] < 0.25 * peaks[False], peaks


def test_checkpointing_gives_the_same_gradients_with_dropout_and_random_partitions():
    grads = []
    for checkpoint in (False, True):
        torch.manual_seed(0)
        model, task = build("sret_transformer", **dict(
            SMALL, dropout=0.2, attention_dropout=0.1, encoder_recursions=3, decoder_recursions=2,
            encoder_groups="2,4,1", decoder_groups="2,1", encoder_partition="random",
            decoder_partition="random", nll_ratio=0.5, checkpoint_recursions=checkpoint))
        model.train()
        d = task.source_dictionary
        g = torch.Generator().manual_seed(1)
        src = torch.randint(d.nspecial, len(d), (3, 15), generator=g)
        src[0, :4] = d.pad()
        prev = torch.randint(d.nspecial, len(d), (3, 9), generator=g)
        torch.manual_seed(7)  # dropout masks and random partitions: recomputed identically
        logits, _ = model(src, src.ne(d.pad()).sum(1), prev)
        logits.logsumexp(-1).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    plain, checkpointed = grads
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=1e-5, msg=name)
