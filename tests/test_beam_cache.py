"""Beam-search reordering of the cross-attention cache, which speeds up generation.

Cross-attention keys/values are only reordered when the batch shrinks, like fairseq's own
encoder-decoder attention; a beam search gives the same hypotheses and scores bit for bit.
"""

import pytest
import torch

from fairseq_sret.core import SlicedGroupAttention, reorder_cache
from fairseq_sret.core.attention import STATIC_KV

pytest.importorskip("fairseq")
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402

import fairseq_sret.models.sret_transformer.layers as sret_module  # noqa: E402
from nmt_helpers import SMALL, build  # noqa: E402


def test_static_cross_cache_is_kept_for_same_size_orders_and_selected_when_the_batch_shrinks():
    attn = SlicedGroupAttention(8, 2, cross_attention=True).eval()
    memory = torch.randn(6, 5, 8)
    cache = {}
    attn(torch.randn(6, 1, 8), memory=memory, cache=cache)
    assert cache[STATIC_KV] is True
    k = cache["k"]
    reorder_cache(cache, torch.tensor([1, 0, 2, 3, 5, 4]))
    assert cache["k"] is k  # same size: hypotheses stay with their sentence, rows are equal
    reorder_cache(cache, torch.tensor([3, 4]))
    assert torch.equal(cache["k"], k[[3, 4]]) and cache["v"].size(0) == 2


def test_self_attention_cache_is_always_reordered():
    attn = SlicedGroupAttention(8, 2, causal=True).eval()
    cache = {}
    attn(torch.randn(3, 1, 8), cache=cache)
    assert STATIC_KV not in cache
    k = cache["k"]
    reorder_cache(cache, torch.tensor([2, 0, 1]))
    assert torch.equal(cache["k"], k[[2, 0, 1]])


def _full_reorder(cache, new_order):
    for name, value in list(cache.items()):
        if isinstance(value, torch.Tensor):
            cache[name] = value.index_select(0, new_order)


@pytest.mark.parametrize("groups", ["1", "2,1"])
def test_beam_search_identical_to_reordering_everything(groups, monkeypatch):
    torch.manual_seed(0)
    model, task = build("sret_transformer", **SMALL, encoder_groups=groups, decoder_groups=groups,
                        decoder_partition="strided,random")
    model.eval()
    d = task.source_dictionary
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([9, 4, 7, 2, 6])
    src = torch.full((5, 9), d.pad())
    for i, n in enumerate(lengths.tolist()):  # left-padded, as fairseq batches sources
        src[i, 9 - n:] = torch.cat([torch.randint(d.nspecial, len(d), (n - 1,), generator=g), torch.tensor([d.eos()])])
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}

    def run():
        hyps = SequenceGenerator([model], task.target_dictionary, beam_size=4, max_len_b=12).forward(sample)
        return [[(h["tokens"].tolist(), h["positional_scores"].tolist()) for h in nbest] for nbest in hyps]

    ours = run()
    monkeypatch.setattr(sret_module, "reorder_cache", _full_reorder)
    assert run() == ours
