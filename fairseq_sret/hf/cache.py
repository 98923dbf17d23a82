"""Incremental decoding of the transformers port through transformers' cache API.

The layout (one self-attention cache per recursion of every shared layer, one cross-attention
cache per shared layer that all its recursions read) is the core's
(:func:`fairseq_sret.core.block_caches`); here it is laid over an
:class:`~transformers.cache_utils.EncoderDecoderCache`, each core cache's keys and values kept
in one layer of it, written through the cache's public ``update(keys, values, layer_idx)``
(so transformers counts, reorders and crops them) and read back as Marian reads its
cross-attention cache.
"""

from typing import List

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache

from ..core import BlockCache, block_caches


class CacheLayerView:
    """Layer ``index`` of a transformers :class:`~transformers.cache_utils.Cache` as the key/value
    store of one core :class:`~fairseq_sret.core.AttentionCache` (the interface of the core's
    :class:`~fairseq_sret.core.KeyValues`: ``update``, ``keys``, ``values``, ``get_seq_length``)."""

    def __init__(self, cache: Cache, index: int):
        self.cache, self.index = cache, index

    def update(self, keys: Tensor, values: Tensor, *args) -> tuple:
        """Append the new steps' keys and values (B, H, T, d); returns every cached step's."""
        try:
            return self.cache.update(keys, values, self.index)
        except IndexError:
            raise ValueError(
                f"this {type(self.cache).__name__} holds {len(self.cache)} layers, SReT decoding needs layer"
                f" {self.index} (one self-attention cache per recursion of every shared layer): pass"
                " cache=SReTCache() (fairseq_sret.hf) or none (generate() makes one)"
            ) from None

    @property
    def keys(self) -> Tensor:
        return self.cache.layers[self.index].keys

    @property
    def values(self) -> Tensor:
        return self.cache.layers[self.index].values

    def get_seq_length(self) -> int:
        return self.cache.get_seq_length(self.index)


def layer_caches(cache: EncoderDecoderCache, index: int, recursions: int) -> List[BlockCache]:
    """The core caches of shared decoder layer ``index`` (applied ``recursions`` times) over
    ``cache``: application ``r`` in self-attention layer ``index * recursions + r``, the shared
    cross-attention cache in cross-attention layer ``index`` (see :class:`SReTCache`)."""
    return block_caches(
        recursions, cross_attention=True,
        self_key_values=[CacheLayerView(cache.self_attention_cache, index * recursions + r) for r in range(recursions)],
        cross_key_values=CacheLayerView(cache.cross_attention_cache, index),
    )


class SReTCache(EncoderDecoderCache):
    """transformers' encoder-decoder cache laid out for SReT decoders of ``R`` recursions:

    - self-attention layer ``i * R + r`` holds application ``r`` of shared decoder layer ``i``:
      one cache per recursion, so the shared module never overwrites its own keys and values;
    - cross-attention layer ``i`` holds the encoder output's keys and values of shared layer
      ``i``, computed by its first application and read by all of them (the same weights read
      the same memory);
    - beam search reorders only the self-attention caches: the encoder keys and values of the
      hypotheses of one sentence are equal rows, so a same-size reordering (which keeps every
      hypothesis with its sentence, as generate()'s beam search does) leaves them alone, as
      fairseq's encoder-decoder attention and :meth:`fairseq_sret.core.AttentionCache.reorder` do; they
      are selected only when the batch changes size.
    """

    def __init__(self):
        super().__init__(DynamicCache(), DynamicCache())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.self_attention_cache.reorder_cache(beam_idx)
        layers = [layer for layer in self.cross_attention_cache.layers if layer.get_seq_length() > 0]
        if layers and layers[0].keys.size(0) != beam_idx.numel():
            self.cross_attention_cache.reorder_cache(beam_idx)
