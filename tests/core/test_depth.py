"""Depth on demand: a model built (and trained) with N recursions run at d <= N.

Equivalences: a model run at depth d equals a model built with d recursions and the same
weights (translation and vision); step-by-step decoding equals the teacher-forced forward at
every depth; a checkpoint built from its trained count with a depth override equals the
model set to that depth, and the older way to say the depth (fewer recursions than the
checkpoint holds) runs that depth.
"""

import logging
import re

import pytest
import torch

from fairseq_sret.core import NonLinearProjection, Recursive, SReTBlock, at_depth, set_depth
from fairseq_sret.vision import SReT
from fairseq_sret.vision.mixer import RecursiveMixer
from conftest import requires_fairseq
from nmt_helpers import SMALL, build


pytestmark = pytest.mark.usefixtures("single_thread")


def perturb_lrc(model):
    """LRC coefficients away from 1, so that a wrong or missing application shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("skip_scale", "branch_scale")):
                p.uniform_(0.5, 1.5)


def truncated(state_dict, depth):
    """The weights of a model built with ``depth`` recursions: the NLLs of later
    applications removed."""
    def keep(key):
        m = re.search(r"\.nlls\.(\d+)\.", key)
        return m is None or int(m.group(1)) < depth

    return {k: v for k, v in state_dict.items() if keep(k)}


# ----------------------------------------------------------------------- core
def test_set_depth_and_at_depth_on_modules():
    layers = torch.nn.Sequential(*[
        Recursive(SReTBlock(8, 2, 16), 3, make_nll=lambda i: NonLinearProjection(8, 1.0)) for _ in range(2)
    ])
    assert [layer.depth for layer in layers] == [3, 3]
    set_depth(layers, 2)
    assert [layer.depth for layer in layers] == [2, 2]
    with at_depth(layers, 1):
        assert [layer.depth for layer in layers] == [1, 1]
    assert [layer.depth for layer in layers] == [2, 2]
    with pytest.raises(ValueError, match="depth=4 is larger than the 3 recursions"):
        set_depth(layers, 4)
    with pytest.raises(ValueError, match="integer >= 1"):
        set_depth(layers, 0)
    assert [layer.depth for layer in layers] == [2, 2]  # unchanged by the failed calls
    set_depth(layers, None)
    assert [layer.depth for layer in layers] == [3, 3]
    with pytest.raises(ValueError, match="no recursive layers"):
        set_depth(torch.nn.Linear(2, 2), 1)


# ----------------------------------------------------------------------- translation
def sample_batch(task, batch=3, src_len=9, tgt_len=7, seed=0, target_padding=True):
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    src = torch.randint(d.nspecial, len(d), (batch, src_len), generator=g)
    src[1, :3] = d.pad()
    src[:, -1] = d.eos()
    lengths = src.ne(d.pad()).sum(1)
    target = torch.randint(d.nspecial, len(d), (batch, tgt_len), generator=g)
    target[:, -1] = d.eos()
    if target_padding:
        target[2, 5:] = d.pad()
    prev = torch.cat([torch.full((batch, 1), d.eos()), target[:, :-1]], dim=1)
    prev[target.eq(d.pad())] = d.pad()
    return src, lengths, prev, target


def nmt(recursions=(3, 2), **overrides):
    kw = dict(SMALL, encoder_recursions=recursions[0], decoder_recursions=recursions[1],
              encoder_groups="2,1,1"[: 2 * recursions[0] - 1], decoder_groups="2,1"[: 2 * recursions[1] - 1],
              decoder_partition="random", nll_ratio=0.5)
    kw.update(overrides)
    model, task = build("sret_transformer", **kw)
    perturb_lrc(model)
    return model.eval(), task


@pytest.mark.parametrize("enc,dec", [(1, 1), (2, 1), (3, 2), (1, 2)])
@requires_fairseq
def test_depth_d_equals_a_model_built_with_d_recursions(enc, dec):
    torch.manual_seed(0)
    deep, task = nmt((3, 2))
    shallow, _ = build("sret_transformer", task, **dict(
        SMALL, encoder_recursions=enc, decoder_recursions=dec, encoder_groups="2,1,1"[: 2 * enc - 1],
        decoder_groups="2,1"[: 2 * dec - 1], decoder_partition="random", nll_ratio=0.5))
    # the decoder and encoder NLL counts differ: load each side's own truncation
    enc_sd = {k: v for k, v in truncated(deep.state_dict(), enc).items() if not k.startswith("decoder.")}
    dec_sd = {k: v for k, v in truncated(deep.state_dict(), dec).items() if k.startswith("decoder.")}
    shallow.load_state_dict({**enc_sd, **dec_sd})  # strict
    shallow.eval()
    src, lengths, prev, _ = sample_batch(task)
    with torch.no_grad():
        expected, _ = shallow(src, lengths, prev)
        with deep.at_depth(enc, dec):
            assert deep.depth == (enc, dec)
            got, _ = deep(src, lengths, prev)
        full, _ = deep(src, lengths, prev)
    assert deep.depth == (3, 2)
    assert (got - expected).abs().max() <= 1e-5
    if (enc, dec) != (3, 2):
        assert (full - expected).abs().max() > 1e-3  # the depth really changed the output


@pytest.mark.parametrize("enc,dec", [(1, 1), (2, 2), (3, 1), (3, 2)])
@requires_fairseq
def test_incremental_decoding_equals_teacher_forcing_at_every_depth(enc, dec):
    torch.manual_seed(1)
    model, task = nmt((3, 2))
    model.set_depth(enc, dec)
    src, lengths, prev, _ = sample_batch(task, tgt_len=8, target_padding=False)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        full = model.get_normalized_probs(model.decoder(prev, encoder_out=encoder_out), log_probs=True)
        state, steps = {}, []
        for t in range(prev.size(1)):
            out = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
            steps.append(model.get_normalized_probs(out, log_probs=True))
    assert (torch.cat(steps, dim=1) - full).abs().max() <= 1e-4
    # only the running applications' self-attention caches are filled; the encoder's keys and
    # values are one cache that every application shares
    for layer in model.decoder.layers:
        caches = layer.get_incremental_state(state, "recursions")["caches"]
        assert [len(c.self_attn) > 0 for c in caches] == [r < dec for r in range(2)]
        assert caches[0].cross_attn is caches[1].cross_attn and len(caches[0].cross_attn) > 0


@requires_fairseq
def test_override_builds_the_trained_count_and_runs_the_requested_depth():
    torch.manual_seed(2)
    trained, task = nmt((3, 2))
    assert (trained.args.encoder_recursions, trained.args.decoder_recursions) == (3, 2)
    assert (trained.args.encoder_depth, trained.args.decoder_depth) == (None, None)
    # what --model-overrides "{'encoder_depth': 1, 'decoder_depth': 1}" does to the saved args
    overridden, _ = nmt((3, 2), encoder_depth=1, decoder_depth=1)
    assert overridden.recursions == (3, 2) and overridden.depth == (1, 1)
    overridden.load_state_dict(trained.state_dict())  # strict: every NLL is there
    src, lengths, prev, _ = sample_batch(task)
    with torch.no_grad(), trained.at_depth(1, 1):
        expected, _ = trained(src, lengths, prev)
    with torch.no_grad():
        got, _ = overridden(src, lengths, prev)
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match=r"--encoder-depth=4 is larger than the 3 recursions"):
        nmt((3, 2), encoder_depth=4)
    # the same, said as a checkpoint saved before --encoder-depth existed says it
    older, _ = nmt((1, 1), encoder_trained_recursions=3, decoder_trained_recursions=2,
                   encoder_groups="2,1,1", decoder_groups="2,1")
    assert older.recursions == (3, 2) and older.depth == (1, 1)
    with pytest.raises(ValueError, match=r"--encoder-recursions=4 is larger than the 3 recursions this model was"
                                         r" trained with \(encoder_trained_recursions=3\)"):
        nmt((4, 2), encoder_trained_recursions=3, encoder_groups="1")
    with pytest.raises(ValueError, match="--decoder-groups has 3 values but there are 2 recursions"):
        nmt((3, 1), decoder_trained_recursions=2, decoder_groups="2,1,1")
    with pytest.raises(ValueError, match="decoder depth=3 is larger than the 2 recursions"):
        trained.set_depth(1, 3)
    assert trained.depth == (3, 2)  # a failed set_depth changes nothing
    with pytest.raises(ValueError, match="decoder depth=3 is larger than the 2 recursions"):
        trained.at_depth(1, 3)
    with trained.at_depth(decoder=1):
        assert trained.depth == (3, 1)
    with pytest.raises(TypeError, match="one depth per side"):
        trained.set_depth(1, 1, 1)
    assert trained.depth == (3, 2)


@requires_fairseq
def test_fewer_recursions_than_the_checkpoint_holds_run_that_depth(caplog):
    torch.manual_seed(3)
    trained, task = nmt((3, 2))
    state = trained.state_dict()
    # --model-overrides "{'encoder_recursions': 1}", the older way to ask for depth 1: the layers
    # are built with the checkpoint's 3 recursions and run 1, with a warning naming --encoder-depth
    older, _ = nmt((1, 2), encoder_groups="2")
    with caplog.at_level(logging.WARNING):
        older.load_state_dict(dict(state))
    assert older.recursions == (3, 2) and older.depth == (1, 2)
    assert (older.args.encoder_recursions, older.args.encoder_depth) == (3, 1)
    assert any("'encoder_depth': 1" in r.getMessage() for r in caplog.records)
    src, lengths, prev, _ = sample_batch(task)
    with torch.no_grad(), trained.at_depth(1, 2):
        expected, _ = trained(src, lengths, prev)
    with torch.no_grad():
        got, _ = older.eval()(src, lengths, prev)
    assert torch.equal(got, expected)
    # more recursions than the checkpoint holds fail, naming both counts
    wrong, _ = nmt((3, 3), decoder_groups="2,1,1")
    with pytest.raises(ValueError, match="--decoder-recursions=3 is larger than the 2 recursions this model was"
                                         " trained with"):
        wrong.load_state_dict(dict(state))
    # per-recursion groups of more recursions than the override builds: the error gives the depth option
    with pytest.raises(ValueError, match=r"--encoder-groups has 3 values but there are 1 recursions.*"
                                         r"'encoder_depth': 1"):
        nmt((1, 2), encoder_groups="2,1,1")
    # without NLLs the weights do not depend on the recursions: a shallower build loads them
    plain, _ = nmt((3, 2), nll_ratio=0.0)
    nmt((1, 1), nll_ratio=0.0, encoder_groups="2", decoder_groups="2")[0].load_state_dict(plain.state_dict())


# ----------------------------------------------------------------------- vision
def tiny_sret(recursions=2, **kw):
    groups = ((4, 2, 1)[:recursions], (1,))
    partition = ("contiguous", "random", "random")[:recursions]
    return SReT(embed_dims=(16, 32), num_heads=(2, 4), blocks=(1, 2), groups=groups, partition=partition,
                recursions=recursions, img_size=32, num_classes=5, **kw)


@pytest.mark.parametrize("make,kwargs", [
    (tiny_sret, {}),
    (RecursiveMixer, dict(img_size=32, patch_size=8, embed_dim=16, depth=2, token_mlp_dim=8, channel_mlp_dim=32,
                          num_classes=5, nll_ratio=0.5)),
])
def test_vision_depth_d_equals_a_model_built_with_d_recursions(make, kwargs):
    torch.manual_seed(6)
    deep = make(recursions=3, **kwargs)
    perturb_lrc(deep)
    x = torch.randn(2, 3, 32, 32)
    deep.eval()
    for depth in (1, 2):
        shallow = make(recursions=depth, **kwargs).eval()
        shallow.load_state_dict(truncated(deep.state_dict(), depth))  # strict
        with torch.no_grad(), deep.at_depth(depth):
            assert deep.depth == depth and deep.recursions == 3
            got = deep(x)
        assert torch.allclose(got, shallow(x), atol=1e-5)
    assert deep.depth == 3
    deep.set_depth(1)
    assert deep.depth == 1
    with pytest.raises(ValueError, match="depth=4 is larger than the 3 recursions"):
        deep.set_depth(4)
    with pytest.raises(TypeError, match="takes one depth, got 1, 2"):
        deep.set_depth(1, 2)
    with pytest.raises(TypeError, match="takes one depth, got encoder=1"):
        deep.at_depth(encoder=1)
    assert deep.depth == 1
