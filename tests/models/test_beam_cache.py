"""The cross-attention cache, which speeds up generation.

Cross-attention keys/values are only reordered when the batch shrinks, like fairseq's own
encoder-decoder attention, and computed once per unique decoder layer, its recursions
sharing them; a beam search gives the same hypotheses and scores bit for bit.
"""

import pytest
import torch

from fairseq_sret.core import AttentionCache, BlockCache, SlicedGroupAttention, fast_paths

pytest.importorskip("fairseq")
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402

from fairseq_sret.core import Recursive  # noqa: E402
from nmt_helpers import sliced_model  # noqa: E402
from test_fold import randomize_lrc, residual_kinds  # noqa: E402


def test_static_cross_cache_is_kept_for_same_size_orders_and_selected_when_the_batch_shrinks():
    attn = SlicedGroupAttention(8, 2, cross_attention=True).eval()
    memory = torch.randn(6, 5, 8)
    cache = AttentionCache()
    attn(torch.randn(6, 1, 8), memory=memory, cache=cache)
    assert cache.is_static
    k = cache.key_values.keys
    cache.reorder(torch.tensor([1, 0, 2, 3, 5, 4]))
    assert cache.key_values.keys is k  # same size: hypotheses stay with their sentence, rows are equal
    cache.reorder(torch.tensor([3, 4]))
    assert torch.equal(cache.key_values.keys, k[[3, 4]]) and cache.key_values.values.size(0) == 2


@pytest.mark.parametrize("empty_row", [False, True])
def test_cached_cross_attention_keeps_its_mask_and_equals_the_uncached_one(empty_row):
    """The memory's padding mask, and whether every query has a key, are computed at the
    first step and kept; a source that is all padding still gives zeros, never NaN."""
    torch.manual_seed(0)
    attn = SlicedGroupAttention(8, 2, cross_attention=True).eval()
    memory = torch.randn(3, 5, 8)
    padding = torch.tensor([[False] * 5, [False, False, False, True, True], [False] * 5])
    if empty_row:
        padding[2] = True
    cache = AttentionCache()
    for _ in range(3):
        x = torch.randn(3, 1, 8)
        cached = attn(x, memory=memory, key_padding_mask=padding, cache=cache)
        torch.testing.assert_close(cached, attn(x, memory=memory, key_padding_mask=padding), rtol=0, atol=0)
        assert not cached.isnan().any()
    assert torch.equal(cache.memory_mask, ~padding[:, None, None, :])
    assert cache.every_row_has_key is (not empty_row)
    mask = cache.memory_mask
    cache.reorder(torch.tensor([1, 0, 2]))
    assert cache.memory_mask is mask  # same size: kept, like the keys and values
    cache.reorder(torch.tensor([1]))
    assert torch.equal(cache.memory_mask, mask[[1]])


def test_self_attention_cache_is_always_reordered():
    attn = SlicedGroupAttention(8, 2, causal=True).eval()
    cache = AttentionCache()
    attn(torch.randn(3, 1, 8), cache=cache)
    assert not cache.is_static
    k = cache.key_values.keys
    cache.reorder(torch.tensor([2, 0, 1]))
    assert torch.equal(cache.key_values.keys, k[[2, 0, 1]])


def _full_reorder(cache, new_order):
    """Every cached tensor selected, the static cross-attention ones too."""
    kv = cache.key_values
    if len(cache):
        kv.keys, kv.values = kv.keys.index_select(0, new_order), kv.values.index_select(0, new_order)
    for name in ("key_padding_mask", "memory_mask"):
        if getattr(cache, name) is not None:
            setattr(cache, name, getattr(cache, name).index_select(0, new_order))


def assert_same_hypotheses(got, expected):
    """The same tokens for every n-best entry, scores equal up to float rounding."""
    assert [[tokens for tokens, _ in nbest] for nbest in got] == [[tokens for tokens, _ in nbest] for nbest in expected]
    for nbest, ref in zip(got, expected):
        for (_, scores), (_, ref_scores) in zip(nbest, ref):
            torch.testing.assert_close(torch.tensor(scores), torch.tensor(ref_scores), rtol=1e-5, atol=1e-5)


def _beam_search_run(groups):
    model, task = sliced_model(groups, seed=0)
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

    return model, run


@pytest.mark.parametrize("groups", ["1", "2,1"])
def test_beam_search_identical_to_reordering_everything(groups, monkeypatch):
    _, run = _beam_search_run(groups)
    ours = run()
    monkeypatch.setattr(AttentionCache, "reorder", _full_reorder)
    assert run() == ours


def test_recursions_share_the_encoder_keys_and_values_computed_once_per_layer(monkeypatch):
    model, run = _beam_search_run("1")
    projections = []
    project = SlicedGroupAttention._project_kv
    monkeypatch.setattr(SlicedGroupAttention, "_project_kv",
                        lambda self, memory: projections.append(self) or project(self, memory))
    shared = run()
    layers = model.decoder.layers
    assert len(projections) == len(layers)  # one per unique layer, not per application
    assert {id(p) for p in projections} == {id(layer.recursive.layer.cross_attn) for layer in layers}
    caches = layers[0].recursive.new_caches()
    assert len(caches) == 2 and caches[0].cross_attn is caches[1].cross_attn
    assert caches[0] is not caches[1] and caches[0].self_attn is not caches[1].self_attn

    def separate_caches(self):
        return [BlockCache() for _ in range(self.recursions)]

    monkeypatch.setattr(Recursive, "new_caches", separate_caches)
    projections.clear()
    assert run() == shared  # the same hypotheses and scores as one cache per application
    assert len(projections) == 2 * len(layers)


def test_beam_search_with_one_query_attention_by_matmul_as_with_sdpa():
    """The decoding steps' attention by matrix products (the default) finds SDPA's hypotheses."""
    _, run = _beam_search_run("2,1")
    with fast_paths(one_query_attention="sdpa"):
        reference = run()
    with fast_paths(one_query_attention="matmul"):
        by_matmul = run()
    assert_same_hypotheses(by_matmul, reference)


@pytest.mark.parametrize("keep", [False, True])
def test_prepared_for_generation_the_lrc_is_folded_and_the_hypotheses_stay(keep):
    """fairseq-generate prepares the model (``prepare_for_inference_``): the LRC coefficients
    go into the neighbouring weights, one operation per residual, and the beam search finds
    the same hypotheses, scores equal up to float rounding; ``keep_lrc_in_generation``
    keeps the coefficients, and the computation, as they were."""
    from types import SimpleNamespace

    model, run = _beam_search_run("2,1")
    randomize_lrc(model, seed=2)  # coefficients away from 1, some negative: folding has work to do
    reference = run()
    before = residual_kinds(model)[0]
    model.args.keep_lrc_in_generation = keep
    model.prepare_for_inference_(SimpleNamespace(generation=SimpleNamespace(beam=4), common=SimpleNamespace()))
    assert residual_kinds(model)[0] == (before if keep else 0) and before > 0
    with pytest.raises(RuntimeError, match="cannot train after make_generation_fast"):
        model.train()
    prepared = run()
    if keep:
        assert prepared == reference
    else:
        assert_same_hypotheses(prepared, reference)
