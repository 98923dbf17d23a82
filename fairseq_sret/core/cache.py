"""The incremental-decoding state of SReT layers, as typed objects.

- :class:`KeyValues`: one attention module's cached keys and values, (B, H, T, d), with the
  interface of a transformers cache layer (``update``, ``keys``, ``values``,
  ``get_seq_length``), so that the transformers adapter hands its own ``Cache`` layers to the
  core in its place (they then count, reorder and crop them) and fairseq's incremental state
  holds these;
- :class:`AttentionCache`: what one attention module keeps across decoding steps: its keys
  and values, the padding of the cached keys (self-attention), and a cross-attention cache's
  mask, computed once with the encoder output's keys and values;
- :class:`BlockCache`: one application of a shared block: its own self-attention cache and
  the cross-attention cache that every application of the block shares (the same weights
  project the same encoder output). A :class:`~fairseq_sret.core.Recursive` layer holds one
  per recursion (``new_caches``), laid out by :func:`block_caches`, the one place that says so.
"""

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor


class KeyValues:
    """Cached keys and values of one attention module, (B, H, T, d) each (None: empty)."""

    def __init__(self):
        self.keys: Optional[Tensor] = None
        self.values: Optional[Tensor] = None

    def update(self, keys: Tensor, values: Tensor, *args) -> Tuple[Tensor, Tensor]:
        """Append the new steps' keys and values; returns every cached step's."""
        if self.keys is not None:
            keys = torch.cat([self.keys, keys], dim=-2)
            values = torch.cat([self.values, values], dim=-2)
        self.keys, self.values = keys, values
        return keys, values

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else self.keys.size(-2)


@dataclass(eq=False)
class AttentionCache:
    """One attention module's state across decoding steps.

    ``key_values``: :class:`KeyValues`, or a transformers cache layer; ``key_padding_mask``:
    (B, T) True at padded cached keys (self-attention); ``memory_mask`` and
    ``every_row_has_key``: a cross-attention cache's mask, (B, 1, 1, S) True where a key may be
    attended (None: no padding), and whether every row has such a key, computed once with its
    keys and values (``every_row_has_key`` None: not computed here, as in a transformers cache
    filled by an earlier call, so the call's padding mask is read instead).
    """

    key_values: Any = field(default_factory=KeyValues)
    key_padding_mask: Optional[Tensor] = None
    memory_mask: Optional[Tensor] = None
    every_row_has_key: Optional[bool] = None

    def __len__(self) -> int:
        """The cached steps (keys)."""
        return self.key_values.get_seq_length()

    @property
    def is_static(self) -> bool:
        """A cross-attention cache filled here: the same keys and values at every step."""
        return self.every_row_has_key is not None

    def reorder(self, new_order: Tensor) -> None:
        """Select batch entries in place (beam search reordering).

        The keys, values and mask of a cross-attention cache (:attr:`is_static`) are only
        selected when the batch changes size, exactly like fairseq's own encoder-decoder
        attention (``MultiheadAttention.reorder_incremental_state``): a beam search reorders
        hypotheses within their sentence, whose rows hold the same encoder output, and shrinks
        the batch when sentences finish. This saves copying every cached encoder key and value
        at every decoding step. (Like fairseq's, it assumes that a same-size reordering keeps
        every hypothesis with its sentence, as fairseq's ``SequenceGenerator`` does.)
        """
        kv = self.key_values
        if len(self) and not (self.is_static and kv.keys.size(0) == new_order.numel()):
            kv.keys, kv.values = kv.keys.index_select(0, new_order), kv.values.index_select(0, new_order)
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, new_order)
        if self.key_padding_mask is not None:
            self.key_padding_mask = self.key_padding_mask.index_select(0, new_order)


@dataclass(eq=False)
class BlockCache:
    """One application of a shared block: its self-attention cache, and the cross-attention
    cache of the block (the same object in every application; None: the block has no
    cross-attention)."""

    self_attn: AttentionCache = field(default_factory=AttentionCache)
    cross_attn: Optional[AttentionCache] = None

    def attention_caches(self) -> Tuple[AttentionCache, ...]:
        return (self.self_attn,) if self.cross_attn is None else (self.self_attn, self.cross_attn)


def block_caches(
    applications: int, cross_attention: bool, self_key_values: Optional[Sequence[Any]] = None,
    cross_key_values: Any = None,
) -> List[BlockCache]:
    """The caches of ``applications`` applications of one shared block: each its own
    self-attention cache, and (``cross_attention``) one cross-attention cache shared by all of
    them. The encoder output's keys and values are the same in every application (the same
    weights project the same memory), so the first application computes them and the others
    read them.

    ``self_key_values`` (one per application) and ``cross_key_values``: the key/value stores to
    hold them (transformers cache layers); None: new :class:`KeyValues`.
    """
    if self_key_values is None:
        self_key_values = [KeyValues() for _ in range(applications)]
    elif len(self_key_values) != applications:
        raise ValueError(f"self_key_values holds {len(self_key_values)} stores for {applications} applications")
    cross = None
    if cross_attention:
        cross = AttentionCache(KeyValues() if cross_key_values is None else cross_key_values)
    return [BlockCache(AttentionCache(key_values), cross) for key_values in self_key_values]
