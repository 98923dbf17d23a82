"""LRC, NLL, the shared block and the recursion wrapper."""

import pytest
import torch
from torch import nn

from fairseq_sret.core import (
    KeyValues,
    LearnableResidual,
    NonLinearProjection,
    Recursive,
    SReTBlock,
    SlicedGroupAttention,
    block_caches,
)

C = 16


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def test_lrc_initialised_to_one_and_scales_both_branches():
    lrc = LearnableResidual(True)
    assert lrc.skip_scale.item() == 1.0 and lrc.branch_scale.item() == 1.0
    x, f = torch.randn(3, C), torch.randn(3, C)
    assert torch.equal(lrc(x, f), x + f)
    with torch.no_grad():
        lrc.skip_scale.fill_(0.5)
        lrc.branch_scale.fill_(-2.0)
    assert torch.allclose(lrc(x, f), 0.5 * x - 2.0 * f)
    (lrc(x, f).sum()).backward()
    assert lrc.skip_scale.grad is not None and lrc.branch_scale.grad is not None


def test_lrc_off_is_plain_residual_without_parameters():
    lrc = LearnableResidual(False)
    assert n_params(lrc) == 0
    x, f = torch.randn(3, C), torch.randn(3, C)
    assert torch.equal(lrc(x, f), x + f)


def test_nll_is_pre_ln_residual_mlp_with_own_ratio():
    torch.manual_seed(0)
    nll = NonLinearProjection(C, hidden_ratio=0.5, lrc=True)
    assert nll.mlp.fc1.out_features == 8
    with torch.no_grad():
        nll.residual.skip_scale.fill_(0.3)
        nll.residual.branch_scale.fill_(1.7)
    x = torch.randn(2, 5, C)
    h = nn.functional.layer_norm(x, (C,), nll.norm.weight, nll.norm.bias)
    mlp = nll.mlp.fc2(nn.functional.gelu(nll.mlp.fc1(h)))
    assert torch.allclose(nll(x), 0.3 * x + 1.7 * mlp, atol=1e-6)
    # params: LN (2C) + fc1 (C*8+8) + fc2 (8*C+C) + 2 LRC scalars
    assert n_params(nll) == 2 * C + (C * 8 + 8) + (8 * C + C) + 2
    assert n_params(NonLinearProjection(C, 0.5, lrc=False)) == n_params(nll) - 2


def test_nll_rejects_bad_ratio():
    with pytest.raises(ValueError, match="hidden_ratio"):
        NonLinearProjection(C, hidden_ratio=0)


@pytest.mark.parametrize("normalize_before", [True, False])
def test_block_with_lrc_at_init_equals_block_without_lrc(normalize_before):
    torch.manual_seed(0)
    with_lrc = SReTBlock(C, 4, 32, normalize_before=normalize_before, lrc=True).eval()
    torch.manual_seed(0)
    plain = SReTBlock(C, 4, 32, normalize_before=normalize_before, lrc=False).eval()
    assert n_params(with_lrc) == n_params(plain) + 4
    x = torch.randn(2, 6, C)
    assert torch.allclose(with_lrc(x), plain(x), atol=1e-6)


def test_block_pre_ln_formula():
    torch.manual_seed(0)
    block = SReTBlock(C, 4, 32, normalize_before=True, lrc=False, activation="relu").eval()
    x = torch.randn(2, 6, C)
    h = x + block.self_attn(block.self_attn_norm(x))
    expected = h + block.ffn.fc2(torch.relu(block.ffn.fc1(block.ffn_norm(h))))
    assert torch.allclose(block(x), expected, atol=1e-6)


class RecordingLayer(nn.Module):
    """A stand-in shared layer that records the recursion indices it is given."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(C, C)
        self.seen = []

    def forward(self, x, recursion, cache=None):
        self.seen.append(recursion)
        if cache is not None:
            cache["calls"] = cache.get("calls", 0) + 1
        return torch.tanh(self.linear(x))


def test_recursion_applies_shared_layer_then_each_nll():
    torch.manual_seed(0)
    layer = RecordingLayer()
    rec = Recursive(layer, 3, make_nll=lambda i: NonLinearProjection(C, 1.0))
    x = torch.randn(2, 4, C)
    expected = x
    for nll in rec.nlls:
        expected = nll(torch.tanh(layer.linear(expected)))
    layer.seen.clear()
    assert torch.allclose(rec(x), expected, atol=1e-6)
    assert [int(step) for step in layer.seen] == [0, 1, 2]
    # one layer + N NLLs, and the NLLs are distinct objects
    assert n_params(rec) == n_params(layer) + 3 * n_params(rec.nlls[0])
    assert len({id(m) for m in rec.nlls}) == 3


def test_recursion_gives_each_application_its_own_cache():
    rec = Recursive(RecordingLayer(), 2)
    caches = [{}, {}]
    rec(torch.randn(1, 1, C), caches=caches)
    rec(torch.randn(1, 1, C), caches=caches)
    assert caches == [{"calls": 2}, {"calls": 2}]
    with pytest.raises(ValueError, match="caches"):
        rec(torch.randn(1, 1, C), caches=[{}])


def test_recursion_passes_index_to_attention_group_counts():
    torch.manual_seed(0)
    block = SReTBlock(C, 4, 32, groups=(4, 1), partition=("contiguous", "strided"))
    rec = Recursive(block, 2).eval()
    x = torch.randn(2, 8, C)
    manual = block(block(x, recursion=0), recursion=1)
    assert torch.allclose(rec(x), manual, atol=1e-6)
    assert not torch.allclose(block(x, recursion=0), block(x, recursion=1), atol=1e-4)


@pytest.mark.parametrize("recursions", [0, -1, 1.5])
def test_recursion_count_validated(recursions):
    with pytest.raises(ValueError, match="recursions"):
        Recursive(nn.Identity(), recursions)


def test_activation_checkpointing_gives_same_gradients():
    torch.manual_seed(0)
    block = SReTBlock(C, 4, 32, groups=(2, 1), partition=("contiguous", "strided"))
    plain = Recursive(block, 2, make_nll=lambda i: NonLinearProjection(C, 1.0)).train()
    ckpt = Recursive(block, 2, checkpoint=True).train()
    ckpt.nlls = plain.nlls
    x = torch.randn(2, 8, C, requires_grad=True)
    plain(x).sum().backward()
    grads = [p.grad.clone() for p in plain.parameters()]
    plain.zero_grad()
    ckpt(x).sum().backward()
    for g, p in zip(grads, ckpt.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-6)


def test_block_caches_one_self_attention_cache_per_application_one_shared_cross_cache():
    decoder_block = SReTBlock(8, 2, 16, causal=True, cross_attention=True)
    caches = decoder_block.new_caches(3)
    assert len(caches) == 3 and len({id(c.self_attn) for c in caches}) == 3
    assert len({id(c.cross_attn) for c in caches}) == 1 and caches[0].cross_attn is not None
    assert all(c.cross_attn is None for c in SReTBlock(8, 2, 16).new_caches(2))
    stores = [KeyValues(), KeyValues()]
    shared = KeyValues()
    given = block_caches(2, cross_attention=True, self_key_values=stores, cross_key_values=shared)
    assert [c.self_attn.key_values for c in given] == stores and given[1].cross_attn.key_values is shared
    with pytest.raises(ValueError, match="holds 1 stores for 2 applications"):
        block_caches(2, cross_attention=False, self_key_values=stores[:1])
