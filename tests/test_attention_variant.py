"""A new attention variant is one new file plus its registration. This module is that file: a
local-window attention, written from scratch against the registry's contract
(:mod:`fairseq_sret.core.attention`) and registered here only, is built by naming it through
the three front doors (fairseq's ``--attention-layer``, the transformers configuration's
``attention_layer``, the vision models' ``attention_layer``) and trains there for a few steps.
No other project file knows it."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_sret.core.attention import ATTENTION_LAYERS, register_attention_layer

pytestmark = pytest.mark.usefixtures("single_thread")

NAME = "local_window_test"


class LocalWindowAttention(nn.Module):
    """Self-attention in which a query sees the keys at most ``window`` positions away (and,
    causal, none after it); cross-attention sees the whole memory. No groups, no incremental
    decoding. x: (B, L, C), memory: (B, Lk, C) -> (B, L, C)."""

    window = 2

    def __init__(self, embed_dim, num_heads, groups=1, partition="contiguous", schedule=None, causal=False,
                 cross_attention=False, bias=True, dropout=0.0, out_bias=None):
        super().__init__()
        self.num_heads, self.causal, self.dropout = num_heads, causal, dropout
        self.groups, self.partition = (1,), ("contiguous",)  # it never slices
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.kv_proj = nn.Linear(embed_dim, 2 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias if out_bias is None else out_bias)

    def forward(self, x, memory=None, key_padding_mask=None, recursion=0, cache=None):
        if cache is not None:
            raise ValueError("LocalWindowAttention does not decode incrementally")
        source = x if memory is None else memory
        (b, length, c), keys, heads = x.shape, source.shape[1], self.num_heads
        q = self.q_proj(x).view(b, length, heads, -1).transpose(1, 2)
        k, v = self.kv_proj(source).view(b, keys, 2, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        allowed = torch.ones(length, keys, dtype=torch.bool, device=x.device)[None, None]
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask[:, None, None, :]
        if memory is None:
            position = torch.arange(length, device=x.device)
            distance = position[:, None] - position[None, :]
            window = distance.abs() <= self.window
            if self.causal:
                window &= distance >= 0
            allowed = (allowed & window) | torch.eye(length, dtype=torch.bool, device=x.device)  # never an empty row
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(b, length, c))


@pytest.fixture(scope="module")
def local_window():
    register_attention_layer(NAME)(LocalWindowAttention)
    yield NAME
    ATTENTION_LAYERS.unregister(NAME)


def train(model, loss_of, steps=10, lr=3e-3):
    """``steps`` Adam steps of ``loss_of(model)``; the losses."""
    torch.manual_seed(0)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_of(model)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def assert_built_with_the_variant(model):
    variants = [m for m in model.modules() if isinstance(m, LocalWindowAttention)]
    assert variants, "no attention layer of the variant was built"
    others = [type(m).__name__ for m in model.modules() if type(m).__name__ == "SlicedGroupAttention"]
    assert not others, others
    return variants


def assert_learns(losses):
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < 0.8 * losses[0], losses


def test_the_vision_front_door_builds_and_trains_the_variant(local_window):
    from fairseq_sret.vision import create_model

    torch.manual_seed(0)
    model = create_model("sret_cifar", attention_layer=local_window, num_classes=4)
    assert_built_with_the_variant(model)
    images, labels = torch.randn(8, 3, 32, 32), torch.arange(8) % 4
    assert_learns(train(model, lambda m: F.cross_entropy(m(images), labels)))


def test_the_fairseq_front_door_builds_and_trains_the_variant(local_window, tmp_path):
    pytest.importorskip("fairseq")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent / "hf"))
    from hf_helpers import BinTask, make_data_bin, sret_checkpoint, toy_batch

    data_bin = make_data_bin(tmp_path)
    task = BinTask(data_bin)
    state = sret_checkpoint(data_bin, tmp_path / "variant.pt", attention_layer=local_window)
    assert state["cfg"]["model"].attention_layer == local_window  # recorded like any model option
    from fairseq.models import ARCH_MODEL_REGISTRY

    model = ARCH_MODEL_REGISTRY["sret_transformer"].build_model(state["cfg"]["model"], task)
    assert_built_with_the_variant(model)
    src, lengths, prev, target = toy_batch(data_bin, task, count=8, with_targets=True)
    pad = task.target_dictionary.pad()

    def loss_of(m):
        logits, _ = m(src, lengths, prev)
        return F.cross_entropy(logits.transpose(1, 2), target, ignore_index=pad)

    assert_learns(train(model, loss_of))


def test_the_transformers_front_door_builds_and_trains_the_variant(local_window):
    pytest.importorskip("transformers")
    from fairseq_sret.hf import SReTConfig, SReTForConditionalGeneration

    config = SReTConfig(vocab_size=24, encoder_embed_dim=32, decoder_embed_dim=32, encoder_ffn_embed_dim=48,
                        decoder_ffn_embed_dim=48, encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_layers=1, decoder_layers=1, dropout=0.0, attention_layer=local_window)
    torch.manual_seed(0)
    model = SReTForConditionalGeneration(config)
    assert_built_with_the_variant(model)
    generator = torch.Generator().manual_seed(1)
    source = torch.randint(4, 24, (6, 9), generator=generator)
    labels = source.flip(1)  # learn to reverse
    losses = train(model, lambda m: m(input_ids=source, labels=labels, use_cache=False).loss)
    assert_learns(losses)
