"""Attention as a seam: a layer registered by name is what ``SReTLayerSpec(attention=...)``
builds its blocks with. A plain multi-head attention over all tokens, defined and registered
here only, builds, runs forward and backward, trains and folds its LRC like the default; the
default is the sliced group attention exactly; an unknown name is a one-line error."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_sret.core import (
    FeedForward, RecursionSchedule, RecursionSpec, SlicedGroupAttention, SReTBlock, SReTLayerSpec, fold_lrc,
)
from fairseq_sret.core.attention import ATTENTION_LAYERS, attention_layer, register_attention_layer

C, H = 16, 2


class FullAttention(nn.Module):
    """Multi-head attention over every token (no groups), one SDPA call: the registry's
    contract and nothing more."""

    def __init__(self, embed_dim, num_heads, groups=1, partition="contiguous", schedule=None, causal=False,
                 cross_attention=False, bias=True, dropout=0.0, out_bias=None):
        super().__init__()
        if cross_attention:
            raise ValueError("FullAttention is a self-attention")
        self.num_heads, self.causal, self.dropout = num_heads, causal, dropout
        self.groups, self.partition = (1,), ("contiguous",)  # it does not slice
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias if out_bias is None else out_bias)

    def forward(self, x, memory=None, key_padding_mask=None, recursion=0, cache=None):
        if cache is not None or memory is not None:
            raise ValueError("FullAttention neither decodes incrementally nor attends to a memory")
        b, length, c = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal and mask is None,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(b, length, c))


@pytest.fixture
def full_attention():
    """``"full_sdpa"`` registered for one test."""
    register_attention_layer("full_sdpa")(FullAttention)
    yield "full_sdpa"
    ATTENTION_LAYERS.unregister("full_sdpa")


def layer_spec(**fields):
    recursion = RecursionSpec(embed_dim=C, schedule=RecursionSchedule.parse(2, groups="2,1", partition="strided"),
                              nll_ratio=0.5)
    return SReTLayerSpec(recursion=recursion, num_heads=H, ffn_dim=2 * C, **fields)


def test_a_registered_attention_layer_builds_runs_and_trains(full_attention):
    torch.manual_seed(0)
    layer = layer_spec(attention=full_attention).build()
    assert type(layer.layer.self_attn) is FullAttention
    x, target = torch.randn(4, 9, C), torch.randn(4, 9, C)
    padding = torch.zeros(4, 9, dtype=torch.bool)
    padding[1, -3:] = True
    out = layer(x, key_padding_mask=padding)
    assert out.shape == x.shape and out.isfinite().all()
    out.square().sum().backward()
    assert layer.layer.self_attn.qkv.weight.grad.abs().sum() > 0
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = F.mse_loss(layer(x, key_padding_mask=padding), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses
    layer.eval()
    torch.testing.assert_close(fold_lrc(layer)(x), layer(x), rtol=1e-5, atol=1e-5)  # LRC folds into out_proj


def test_the_default_attention_is_the_sliced_group_attention_built_directly():
    spec = layer_spec()
    assert spec.attention == "sliced_group" and attention_layer("sliced_group") is SlicedGroupAttention
    torch.manual_seed(0)
    layer = spec.build()
    torch.manual_seed(0)
    direct = SlicedGroupAttention(C, H, schedule=spec.schedule)
    attn = layer.layer.self_attn
    assert type(attn) is SlicedGroupAttention and attn.groups == direct.groups == (2, 1)
    assert attn.state_dict().keys() == direct.state_dict().keys()
    assert all(torch.equal(attn.state_dict()[k], direct.state_dict()[k]) for k in direct.state_dict())
    x = torch.randn(2, 12, C)
    for step in spec.schedule.steps:
        torch.testing.assert_close(attn(x, recursion=step), direct(x, recursion=step), rtol=0, atol=0)
    # the block built with the default layers is the block built with them named
    torch.manual_seed(1)
    default = SReTBlock(C, H, 2 * C, causal=True, cross_attention=True)
    torch.manual_seed(1)
    named = SReTBlock(C, H, 2 * C, causal=True, cross_attention=True, attn_layer=SlicedGroupAttention,
                      mlp_layer=FeedForward, norm_layer=nn.LayerNorm)
    assert list(default.state_dict()) == list(named.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(default.state_dict().values(), named.state_dict().values()))


@pytest.mark.reliability("one-line-errors")
def test_an_unknown_attention_name_is_a_one_line_error_listing_the_registered_ones(full_attention):
    with pytest.raises(ValueError) as error:
        layer_spec(attention="no_such_attention")
    message = str(error.value)
    assert message.startswith("SReTLayerSpec.attention must be a registered attention layer")
    assert "sliced_group" in message and "full_sdpa" in message and "\n" not in message
    with pytest.raises(ValueError, match=r"^unknown attention layer 'nope'; registered: sliced_group, full_sdpa$"):
        attention_layer("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_attention_layer("sliced_group")(FullAttention)
