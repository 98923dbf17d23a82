"""Property fuzzing of the fairseq ``sret_transformer`` over random configurations.

Each example draws recursions 1-4 and groups 1-8 per recursion for both sides, partition
modes, LRC / NLL / post-LN / activation checkpointing on or off, 1-2 unique layers,
source lengths 1-64 (left-padded as fairseq batches them) and target lengths 1-12, then
checks on one model: finite loss and gradients in training; identical outputs from two
eval forwards; every sentence translated alone gets the outputs it got in the batch;
incremental (beam-search style) decoding equals the teacher-forced forward.
"""

import math

import pytest
import torch

pytest.importorskip("fairseq")

from hypothesis import given
from hypothesis import strategies as st

from nmt_helpers import DummyTask, build
from test_fuzz_core import fuzz

pytestmark = pytest.mark.fuzz

TASK = DummyTask(vocab_size=20)


def per_recursion(draw, values, recursions):
    items = draw(st.lists(values, min_size=recursions, max_size=recursions))
    return ",".join(map(str, items)) if draw(st.booleans()) or recursions == 1 else str(items[0])


@st.composite
def nmt_configs(draw):
    enc_r, dec_r = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    return dict(
        encoder_recursions=enc_r,
        decoder_recursions=dec_r,
        encoder_groups=per_recursion(draw, st.integers(1, 8), enc_r),
        decoder_groups=per_recursion(draw, st.integers(1, 8), dec_r),
        encoder_partition=draw(st.sampled_from(["auto"]))
        if draw(st.booleans()) else per_recursion(draw, st.sampled_from(["contiguous", "strided", "random"]), enc_r),
        decoder_partition="auto" if draw(st.booleans()) else per_recursion(draw, st.sampled_from(["strided", "random"]), dec_r),
        nll_ratio=draw(st.sampled_from([0.0, 0.5])),
        no_lrc=draw(st.booleans()),
        post_ln=draw(st.booleans()),
        checkpoint_recursions=draw(st.booleans()),
        encoder_layers=draw(st.integers(1, 2)),
        decoder_layers=draw(st.integers(1, 2)),
    )


def batch(seed, src_lengths, tgt_len):
    d = TASK.source_dictionary
    g = torch.Generator().manual_seed(seed)
    width = max(src_lengths)
    src = torch.full((len(src_lengths), width), d.pad())
    for row, n in enumerate(src_lengths):  # left padding, eos last
        src[row, width - n:] = torch.randint(d.nspecial, len(d), (n,), generator=g)
        src[row, -1] = d.eos()
    prev = torch.randint(d.nspecial, len(d), (len(src_lengths), tgt_len), generator=g)
    prev[:, 0] = d.eos()
    return src, torch.tensor(src_lengths), prev


@fuzz(30)
@given(cfg=nmt_configs(), src_lengths=st.lists(st.integers(1, 64), min_size=1, max_size=3),
       tgt_len=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_random_sret_transformer_configurations_hold(cfg, src_lengths, tgt_len, seed):
    torch.manual_seed(seed)
    model, _ = build("sret_transformer", TASK, encoder_embed_dim=16, decoder_embed_dim=16,
                     encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32, encoder_attention_heads=2,
                     decoder_attention_heads=2, dropout=0.1, attention_dropout=0.1, **cfg)
    src, lengths, prev = batch(seed, src_lengths, tgt_len)
    target = torch.roll(prev, -1, dims=1)

    # training: finite loss and gradients
    model.train()
    logits, _ = model(src, lengths, prev)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), target.view(-1))
    assert math.isfinite(loss.item())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name

    model.eval()
    with torch.no_grad():
        torch.manual_seed(0)
        full = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        torch.manual_seed(1)
        again = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        assert torch.equal(full, again)
        assert torch.isfinite(full).all()

        # each sentence alone: same outputs as in the batch (order and padding do not matter)
        for row, n in enumerate(src_lengths):
            alone = model.get_normalized_probs(
                model(src[row : row + 1, -n:], lengths[row : row + 1], prev[row : row + 1]), log_probs=True)
            torch.testing.assert_close(alone[0], full[row], atol=1e-4, rtol=1e-4)

        # incremental decoding, one token at a time, equals teacher forcing
        encoder_out = model.encoder(src, src_lengths=lengths)
        state = {}
        steps = [
            model.get_normalized_probs(
                model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state), log_probs=True)
            for t in range(tgt_len)
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)
