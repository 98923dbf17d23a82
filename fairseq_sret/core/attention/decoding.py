"""The attention of decoding: causal self-attention of new steps over cached keys and
values, and cross-attention to the encoder output (its keys and values computed once per
cache). Functions of a :class:`~fairseq_sret.core.attention.SlicedGroupAttention` ``attn``
and an :class:`~fairseq_sret.core.cache.AttentionCache` owned by the caller."""

from typing import Optional

import torch
from torch import Tensor

from ..cache import AttentionCache
from ..config import is_compiling
from ..linear import linear
from ..partition import group_of_position
from ..schedule import RecursionStep


def incremental_self_attention(
    attn, x: Tensor, key_padding_mask: Optional[Tensor], step: RecursionStep, cache: AttentionCache
) -> Tensor:
    """Causal self-attention for new steps x (B, T_new, C) given cached keys/values
    (appended to), sliced as ``step`` says (the deterministic partitions). -> (B, T_new, C)"""
    if not attn.causal:
        raise ValueError("incremental decoding needs a causal self-attention module")
    groups = step.groups
    if groups > 1 and step.partition == "random" and attn.training:
        raise RuntimeError(
            "incremental decoding with a random partition needs eval() mode (the"
            " deterministic strided partition); call model.eval() before decoding"
        )
    q, k, v = (attn._split_heads(t) for t in linear(x, attn.qkv).chunk(3, dim=-1))
    k, v = cache.key_values.update(k, v)
    total, new = k.size(2), q.size(2)
    key_padding_mask = extend_cached_padding(key_padding_mask, cache, total, new)
    if new == 1 and key_padding_mask is None and groups == 1:
        mask = None  # one query attending to every cached key: no mask needed
    else:
        positions = torch.arange(total, device=x.device)
        mask = positions[None, :] <= positions[total - new:, None]  # (T_new, total)
        mask = mask[None, None]
        if key_padding_mask is not None:
            mask = mask & ~key_padding_mask[:, None, None, :]
        if groups > 1:
            valid = None if key_padding_mask is None else ~key_padding_mask
            group = group_of_position(valid, total, groups, x.device)  # (B|1, total)
            same = group[:, None, total - new:, None] == group[:, None, None, :]
            mask = mask & same
    out = attn._attend(q, k, v, mask, is_causal=False)
    return linear(attn._merge_heads(out), attn.out_proj)


def extend_cached_padding(
    key_padding_mask: Optional[Tensor], cache: AttentionCache, total: int, new: int
) -> Optional[Tensor]:
    """Padding mask over cache + new steps (kept in ``cache``); accepts a mask for the new
    steps only."""
    cached = cache.key_padding_mask
    if key_padding_mask is None and cached is None:
        return None
    if key_padding_mask is not None and key_padding_mask.size(1) == total:
        full = key_padding_mask
    else:
        batch = (key_padding_mask if key_padding_mask is not None else cached).size(0)
        device = (key_padding_mask if key_padding_mask is not None else cached).device
        if cached is None:
            cached = torch.zeros(batch, total - new, dtype=torch.bool, device=device)
        if key_padding_mask is None:
            key_padding_mask = torch.zeros(batch, new, dtype=torch.bool, device=device)
        if cached.size(1) + key_padding_mask.size(1) != total:
            raise ValueError(
                f"key_padding_mask covers {key_padding_mask.size(1)} positions; expected"
                f" {new} (new steps) or {total} (cache + new steps)"
            )
        full = torch.cat([cached, key_padding_mask], dim=1)
    cache.key_padding_mask = full
    return full


def cross_attention(
    attn, x: Tensor, memory: Optional[Tensor], key_padding_mask: Optional[Tensor], cache: Optional[AttentionCache],
) -> Tensor:
    """x (B, L, C) attending to memory (B, Lk, C), key_padding_mask (B, Lk) True at padding.
    With a cache, the memory's keys, values and mask are computed at the first call and read
    at the others (``memory`` may then be None). -> (B, L, C)"""
    if cache is not None and len(cache):
        k, v = cache.key_values.keys, cache.key_values.values
        if cache.is_static:
            mask, every_row_has_key = cache.memory_mask, cache.every_row_has_key
        else:  # keys and values kept by an earlier call (a transformers Cache): the call's mask
            mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
            every_row_has_key = False
    else:
        if memory is None:
            raise ValueError("cross-attention needs memory (the encoder output)")
        k, v = attn._project_kv(memory)
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        every_row_has_key = False
        if cache is not None:
            # the memory's keys, values and mask are the same at every decoding step:
            # computed, and checked for sources that are all padding, once
            every_row_has_key = mask is None or (not is_compiling() and bool(mask.any(dim=-1).all()))
            # contiguous once, so that no decoding step copies them for its matrix products
            k, v = cache.key_values.update(k.contiguous(), v.contiguous())
            cache.memory_mask, cache.every_row_has_key = mask, every_row_has_key
    q = attn._project_q(x)
    out = attn._attend(q, k, v, mask, is_causal=False, every_row_has_key=every_row_has_key)
    return linear(attn._merge_heads(out), attn.out_proj)
