"""Self-attention inside groups of tokens: the ways of computing it, registered by name.

Every strategy is ``fn(attn, qkv, valid, groups, mode) -> (B, L, C)``: ``attn`` the
:class:`~fairseq_sret.core.attention.SlicedGroupAttention` (heads, causality, dropout, the
kernel choice), ``qkv`` (B, L, 3C) the projected input, ``valid`` (B, L) True at real tokens
(None: no padding), ``groups`` G > 1 and ``mode`` the partition (see
:mod:`fairseq_sret.core.partition`); the output is before ``out_proj``, zero at padding.
They compute the same function (the random partition draws the same groups from the same
random numbers); :func:`grouped_strategy` says which one runs.

- ``one_kernel``: one attention call over the whole sequence with a group mask;
- ``shuffled``: the random partition of unpadded tokens into equal groups, as the official
  code draws it;
- ``packed``: the groups packed into a batch of slices (reshapes when G divides L without
  padding, else a partition and gathers).
"""

from typing import Optional

import torch
from torch import Tensor

from ..config import is_compiling
from ..partition import cached_group_mask, cached_partition, compute_partition, group_of_position
from .registry import GROUPED_ATTENTION

# Sliced attention over sequences of at most this many tokens runs as one attention kernel
# over the whole sequence with a group mask (the same function) instead of packing the
# groups: (unpadded, padded) per device type. Short sequences make the packed kernels
# launch- and memory-bound, and a padded batch would need a partition (sort, scatters,
# gathers) in every forward, while masked full attention over L tokens stays cheap.
# The limits are where the one kernel stopped being faster in benchmarks.bench_attention
# (docs/benchmarks/attention.md). ``fast_paths(grouped_one_kernel=N)`` sets both (0 = never).
ONE_KERNEL_MAX_LENGTH = {"cpu": (32, 128), "cuda": (256, 512)}


def one_kernel_max_length(device: torch.device, padded: bool, chosen: Optional[int]) -> int:
    """The longest sequence that runs as ``one_kernel``: ``chosen`` (the switch
    ``grouped_one_kernel`` as the layer read it), None: the device's default."""
    if chosen is None:
        return ONE_KERNEL_MAX_LENGTH.get(device.type, (0, 0))[int(padded)]
    return chosen


def grouped_strategy(attn, qkv: Tensor, valid: Optional[Tensor], groups: int, mode: str) -> str:
    """The name of the strategy that computes this grouped attention."""
    length = qkv.size(1)
    if mode != "random" and length <= one_kernel_max_length(qkv.device, valid is not None, attn.one_kernel_max_length):
        return "one_kernel"
    if mode == "random" and valid is None and not attn.causal and length % groups == 0:
        return "shuffled"
    return "packed"


def split_qkv(attn, qkv: Tensor) -> Tensor:
    """(N, S, 3C) -> 3 x (N, H, S, d): the same views as chunk + per-head views, in fewer
    operations (forward and backward)."""
    slices, width, _ = qkv.shape
    return qkv.view(slices, width, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)


def attend_slices(attn, packed: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Attention inside each slice: packed (N, S, 3C) projected q/k/v of N slices (groups)
    of S slots, mask None or broadcastable to (N, H, S, S) -> (N, S, H, d)."""
    q, k, v = split_qkv(attn, packed)
    return attn._attend(q, k, v, mask, is_causal=attn.causal and mask is None).permute(0, 2, 1, 3)


@GROUPED_ATTENTION.register("one_kernel")
def one_kernel(attn, qkv: Tensor, valid: Optional[Tensor], groups: int, mode: str) -> Tensor:
    """One attention call over the whole sequence: key j is allowed for query i when both
    are real tokens of the same group (and j <= i when causal). No packing, gathers or
    partition tensors."""
    length = qkv.size(1)
    q, k, v = split_qkv(attn, qkv)
    if valid is None:
        mask = cached_group_mask(length, groups, mode, qkv.device)
    else:
        group = group_of_position(valid, length, groups, qkv.device, mode)  # (B, L), -1 = padding
        mask = (group[:, None, :, None] == group[:, None, None, :]) & valid[:, None, None, :]
    if attn.causal:
        mask = mask & torch.ones(length, length, dtype=torch.bool, device=qkv.device).tril()
    # unpadded, every query attends at least to itself
    out = attn._merge_heads(attn._attend(q, k, v, mask, is_causal=False, every_row_has_key=valid is None))
    if valid is not None:
        out = out * valid.unsqueeze(-1).to(out.dtype)
    return out


@GROUPED_ATTENTION.register("shuffled")
def shuffled(attn, qkv: Tensor, valid: Optional[Tensor], groups: int, mode: str) -> Tensor:
    """One random permutation of the positions, whose consecutive slices are the groups
    (unpadded, G divides L, not causal). The same groups as
    :func:`~fairseq_sret.core.partition.compute_partition` draws from the same random
    numbers; only the order inside a group differs, which non-causal attention does not see.
    Four operations (draw, sort, gather, scatter back) instead of the general partition's
    dozens."""
    batch, length, _ = qkv.shape
    width, channels = length // groups, attn.embed_dim
    order = torch.rand(length, device=qkv.device).argsort()
    packed = qkv.index_select(1, order).view(batch * groups, width, 3 * channels)
    out = attend_slices(attn, packed, None).reshape(batch, length, channels)  # slot order
    return torch.empty_like(out).index_copy_(1, order, out)


@GROUPED_ATTENTION.register("packed")
def packed_groups(attn, qkv: Tensor, valid: Optional[Tensor], groups: int, mode: str) -> Tensor:
    """The groups packed into (B*G, S, 3C) slices. Without padding, equal slices are plain
    reshapes (no gather, no index tensors): contiguous slice g holds positions g*S ..
    g*S+S-1, strided group g positions g, g+G, g+2G, ... (position s*G+g is slot s of group
    g); otherwise a partition (cached when deterministic) and gathers."""
    batch, length, _ = qkv.shape
    channels = attn.embed_dim
    if valid is None and length % groups == 0 and mode in ("contiguous", "strided"):
        width = length // groups
        packed = qkv if mode == "contiguous" else qkv.view(batch, width, groups, 3 * channels).transpose(1, 2)
        out = attend_slices(attn, packed.reshape(batch * groups, width, 3 * channels), None)
        if mode == "contiguous":
            return out.reshape(batch, length, channels)
        return out.reshape(batch, groups, width, channels).transpose(1, 2).reshape(batch, length, channels)
    if valid is None and mode != "random":
        # deterministic partition of unpadded sequences: computed once per (L, G, mode)
        slots, slot_valid, inverse = cached_partition(length, groups, mode, qkv.device)
    else:
        slots, slot_valid, inverse = compute_partition(valid, length, groups, mode, qkv.device)
    width = slots.size(1) // groups
    if slots.size(0) == 1:
        packed = qkv.index_select(1, slots[0])
    else:
        packed = qkv.gather(1, slots.unsqueeze(-1).expand(-1, -1, 3 * channels))
    mask = None
    # Unpadded: every slot holds a token exactly when G divides L (groups of ceil(L/G)
    # or one fewer), known without reading slot_valid (no device-to-host sync).
    some_empty = (length % groups != 0) if valid is None else (
        slot_valid is not None and (is_compiling() or not bool(slot_valid.all()))
    )
    if some_empty:
        mask = slot_valid.view(-1, groups, width).expand(batch, -1, -1).reshape(batch * groups, 1, 1, width)
        if attn.causal:
            # positions increase inside a group and empty slots sit at the end, so the
            # slot order is the causal order
            mask = mask & torch.ones(width, width, dtype=torch.bool, device=qkv.device).tril()
    out = attend_slices(attn, packed.reshape(batch * groups, width, 3 * channels), mask)
    out = out.reshape(batch, groups * width, channels)
    if inverse.size(0) == 1:
        out = out.index_select(1, inverse[0])
    else:
        out = out.gather(1, inverse.unsqueeze(-1).expand(-1, -1, channels))
    if valid is not None:
        out = out * valid.unsqueeze(-1).to(out.dtype)
    return out
