"""fold_lrc: the folded inference copy computes what the model computes.

Tolerances: float64 to 1e-10 relative (the folding is exact in exact arithmetic, LayerNorm
eps and weight signs included); float32 to 1e-4 relative (rounding only).
"""

import importlib.util

import pytest
import torch

from fairseq_sret.core import FoldedResidual, LearnableResidual, NonLinearProjection, Recursive, SReTBlock, fold_lrc
from fairseq_sret.vision import create_model

HAVE_FAIRSEQ = importlib.util.find_spec("fairseq") is not None


def randomize_lrc(model, negative=True, seed=0):
    """LRC coefficients in [0.3, 1.7], about a third of them negative."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("skip_scale", "branch_scale")):
                v = 0.3 + 1.4 * torch.rand(1, generator=g, dtype=p.dtype)
                if negative and torch.rand(1, generator=g).item() < 0.33:
                    v = -v
                p.copy_(v)


def rel_err(a, b):
    return ((a - b).abs().max() / a.abs().max()).item()


def residual_kinds(model):
    learnable = sum(isinstance(m, LearnableResidual) and m.learnable for m in model.modules())
    folded = [m.skip_factor for m in model.modules() if isinstance(m, FoldedResidual)]
    return learnable, folded


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
@pytest.mark.parametrize("skip", [True, False])
def test_fold_sret_t(dtype, tol, skip):
    torch.manual_seed(0)
    model = create_model("sret_t", img_size=64, num_classes=10).to(dtype)
    randomize_lrc(model)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for norm in norms:  # the stem's BatchNorms: the copy folds them into its convolutions once
        norm.running_mean.uniform_(-0.5, 0.5)
        norm.running_var.uniform_(0.5, 2.0)
        torch.nn.init.uniform_(norm.weight, -2.0, 2.0)
        torch.nn.init.uniform_(norm.bias, -0.5, 0.5)
    model.eval()
    x = torch.randn(2, 3, 64, 64, dtype=dtype)
    folded = fold_lrc(model, skip=skip)
    stems = [m for m in folded.modules() if hasattr(m, "inference_weight")]
    assert len(norms) == 3 and len(stems) == 3 and all(m.inference_weight is not None for m in stems)
    assert not folded.training and folded is not model
    with torch.no_grad():
        assert rel_err(model(x), folded(x)) < tol
    learnable, factors = residual_kinds(folded)
    assert learnable == 0 and len(factors) == 40  # 10 shared blocks x 2 residuals + 20 NLLs
    if skip:
        # per shared block the attention residual is a plain add, the FFN residual keeps one
        # factor; every NLL keeps its skip factor (each starts and ends at the true scale)
        assert sum(f == 1.0 for f in factors) == 10
    # the original is untouched
    assert residual_kinds(model)[0] == 40
    assert all(m.inference_weight is None for m in model.modules() if hasattr(m, "inference_weight"))


def test_fold_shares_weights_like_the_model():
    torch.manual_seed(0)
    model = create_model("sret_t", img_size=64, num_classes=10)
    folded = fold_lrc(model)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    lrc = sum(p.numel() for name, p in model.named_parameters() if name.endswith(("skip_scale", "branch_scale")))
    assert n(folded) == n(model) - lrc


def test_fold_mixer_and_zero_skip_scale():
    torch.manual_seed(0)
    model = create_model(
        "recursive_mixer_b16", img_size=32, embed_dim=32, depth=2, token_mlp_dim=16, channel_mlp_dim=64,
        num_classes=10,
    ).double()
    randomize_lrc(model)
    with torch.no_grad():  # a zero skip scale: that layer falls back to branch-only folding
        model.blocks[0].layer.token_residual.skip_scale.zero_()
    model.eval()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    folded = fold_lrc(model)
    assert rel_err(model(x), folded(x)) < 1e-10
    layer = folded.blocks[0].layer
    assert layer.token_residual.skip_factor == 0.0 and layer.channel_residual.skip_factor != 1.0


@pytest.mark.parametrize("normalize_before", [True, False])
def test_fold_core_recursive_with_nll(normalize_before):
    torch.manual_seed(0)
    block = SReTBlock(16, 2, 24, groups=(2, 1, 1), normalize_before=normalize_before)
    model = Recursive(block, 3, make_nll=lambda i: NonLinearProjection(16, 0.5)).double()
    randomize_lrc(model, seed=1)
    model.eval()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    folded = fold_lrc(model)
    assert rel_err(model(x), folded(x)) < 1e-10
    if not normalize_before:  # post-LN: every residual of the block becomes a plain add
        assert folded.layer.self_attn_residual.skip_factor == folded.layer.ffn_residual.skip_factor == 1.0


def test_fold_leaves_plain_residuals_alone():
    block = SReTBlock(16, 2, 24, lrc=False)
    folded = fold_lrc(block)
    assert isinstance(folded.self_attn_residual, LearnableResidual) and not folded.self_attn_residual.learnable


@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq not installed")
@pytest.mark.parametrize("post_ln,nll_ratio", [(False, 1.0), (False, 0.0), (True, 1.0)])
def test_fold_translation_model(post_ln, nll_ratio):
    from fairseq_sret_cli.toy import build_model

    torch.manual_seed(0)
    model = build_model(
        "sret_transformer_tiny", encoder_embed_dim=32, decoder_embed_dim=32, encoder_ffn_embed_dim=48,
        decoder_ffn_embed_dim=48, encoder_attention_heads=4, decoder_attention_heads=4, encoder_layers=2,
        decoder_layers=2, dropout=0.0, post_ln=post_ln, nll_ratio=nll_ratio,
    ).double()
    randomize_lrc(model)
    model.eval()
    src = torch.randint(4, 30, (3, 7))
    src[0, :2] = 1  # left padding
    lengths = (src != 1).sum(1)
    prev = torch.randint(4, 30, (3, 6))
    folded = fold_lrc(model)
    with torch.no_grad():
        assert rel_err(model(src, lengths, prev)[0], folded(src, lengths, prev)[0]) < 1e-10
        # incremental decoding (beam search's path) on the folded model
        enc = folded.encoder(src, src_lengths=lengths)
        state, steps = {}, []
        for t in range(prev.size(1)):
            steps.append(folded.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0])
        teacher = folded.decoder(prev, encoder_out=enc)[0]
        assert rel_err(teacher, torch.cat(steps, dim=1)) < 1e-10
    assert folded.lrc_coefficients() == {}
