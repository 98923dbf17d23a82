"""Token partitions for sliced group self-attention (paper Sec. 4, Appendix Alg. 1).

A partition assigns every real (non-padding) token of a sequence to one of ``G`` groups;
attention is then computed inside each group only. Groups are packed into a dense tensor
of ``G`` slots rows of width ``S`` (the largest group) so one batched attention call
handles all of them.

Partition modes (the real tokens of each sequence are ranked ``0 .. n-1`` in order):

- ``contiguous``: consecutive slices of near-equal size (sizes differ by at most one;
  equal to the official code's ``reshape`` when ``n`` is divisible by ``G``).
- ``strided``: token of rank ``r`` goes to group ``r mod G``. Depends only on the rank,
  so it is prefix-consistent and usable for incremental (causal) decoding.
- ``random``: a fresh uniformly random partition in every training forward (the
  official code's permutation + inverse permutation). In ``eval()`` it is replaced by
  ``strided`` so that inference is deterministic.
"""

from collections import OrderedDict
from typing import Optional, Tuple

import torch
from torch import Tensor

from .config import is_capturing_cuda_graph, is_compiling

PARTITION_MODES = ("contiguous", "strided", "random")


def _group_of_rank(rank: Tensor, count: Tensor, groups: int, mode: str) -> Tensor:
    """Group index of each token given its rank among the ``count`` real tokens.

    rank: (B, L) long, count: (B, 1) long. Returns (B, L) long in [0, groups).
    """
    if mode == "strided":
        return rank % groups
    # contiguous, balanced: the first ``count % groups`` slices hold one token more.
    base = count // groups
    rem = count % groups
    big = rem * (base + 1)
    in_big = rank < big
    small_group = rem + (rank - big) // base.clamp(min=1)
    return torch.where(in_big, rank // (base + 1), small_group)


def compute_partition(
    valid: Optional[Tensor],
    length: int,
    groups: int,
    mode: str,
    device: torch.device,
    generator: Optional[torch.Generator] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Pack the real tokens of each sequence into ``groups`` rows of slots.

    Args:
        valid: (B, L) bool, True for real tokens; None when nothing is padded (then one
            partition is shared by the whole batch and the returned tensors have B=1).
        length: L.
        groups: G >= 1. The caller caps it at L (more groups than tokens only adds
            empty groups).
        mode: ``contiguous``, ``strided`` or ``random`` (random draws a new partition).

    Returns:
        slots: (B, G*S) long, the position held by each slot, group-major, positions
            increasing inside a group; empty slots hold 0 (any valid index) and are
            flagged by ``slot_valid``.
        slot_valid: (B, G*S) bool.
        inverse: (B, L) long, the slot holding each position (0 for padded positions).
    """
    batch = 1 if valid is None else valid.size(0)
    positions = torch.arange(length, device=device).expand(batch, length)
    # Without padding every mode makes groups of ceil(L/G) or one token fewer, so the slot
    # width is known without reading the data (no device-to-host sync).
    # Under torch.compile the data-dependent width would break the graph: use the bound
    # ceil(L/G) there (more empty slots, flagged invalid, same result).
    known_width = None if valid is not None else max(-(-length // groups), 1)
    if known_width is None and is_compiling():
        known_width = max(-(-length // groups), 1)
    if valid is None:
        valid = torch.ones(batch, length, dtype=torch.bool, device=device)
    count = valid.sum(dim=1, keepdim=True)
    rank = valid.cumsum(dim=1) - 1
    if mode == "random":
        # A uniformly random order of the real tokens; padded tokens sort last.
        keys = torch.rand(batch, length, device=device, generator=generator)
        keys = keys.masked_fill(~valid, 2.0)
        order = keys.argsort(dim=1)
        rank = torch.empty_like(order).scatter_(1, order, positions.contiguous())
        group = _group_of_rank(rank, count, groups, "contiguous")
    else:
        group = _group_of_rank(rank, count, groups, mode)
    group = group.masked_fill(~valid, groups)  # padded tokens: a virtual group past the end

    # Sort tokens group-major, by position inside a group.
    sort_key = group * length + positions
    sorted_key, sorted_pos = sort_key.sort(dim=1)
    sorted_group = sorted_key // length
    sizes = torch.zeros(batch, groups + 1, dtype=torch.long, device=device)
    sizes.scatter_add_(1, group, torch.ones_like(group))
    sizes = sizes[:, :groups]
    width = known_width if known_width is not None else max(int(sizes.max()), 1)
    starts = sizes.cumsum(dim=1) - sizes
    in_group = sorted_group < groups
    safe_group = sorted_group.clamp(max=groups - 1)
    slot_in_group = torch.arange(length, device=device) - starts.gather(1, safe_group)
    flat_slot = safe_group * width + slot_in_group

    slots = torch.zeros(batch, groups * width, dtype=torch.long, device=device)
    slot_valid = torch.zeros(batch, groups * width, dtype=torch.bool, device=device)
    trash = groups * width  # scatter target for padded tokens, dropped afterwards
    target = torch.where(in_group, flat_slot, torch.full_like(flat_slot, trash))
    slots = torch.cat([slots, slots.new_zeros(batch, 1)], dim=1)
    slot_valid = torch.cat([slot_valid, slot_valid.new_zeros(batch, 1)], dim=1)
    slots.scatter_(1, target, sorted_pos.contiguous())
    slot_valid.scatter_(1, target, in_group)
    slots, slot_valid = slots[:, :trash], slot_valid[:, :trash]

    inverse = torch.zeros(batch, length, dtype=torch.long, device=device)
    inverse.scatter_(1, sorted_pos.contiguous(), torch.where(in_group, flat_slot, 0))
    return slots, slot_valid, inverse


def group_of_position(valid: Optional[Tensor], length: int, groups: int, device, mode: str = "strided") -> Tensor:
    """Group index of every position (B or 1, L) in a ``strided`` or ``contiguous``
    partition (the groups of :func:`compute_partition`); padded positions get -1."""
    if mode not in ("contiguous", "strided"):
        raise ValueError(f"group_of_position: deterministic modes only, got {mode!r}")
    if valid is None:
        positions = torch.arange(length, device=device)
        if mode == "strided":
            return (positions % groups).unsqueeze(0)
        count = torch.full((1, 1), length, dtype=torch.long, device=device)
        return _group_of_rank(positions.unsqueeze(0), count, groups, mode)
    rank = valid.cumsum(dim=1) - 1
    if mode == "strided":
        group = rank % groups
    else:
        group = _group_of_rank(rank, valid.sum(dim=1, keepdim=True), groups, mode)
    return torch.where(valid, group, torch.full_like(rank, -1))


_CACHE: "OrderedDict[tuple, object]" = OrderedDict()
_CACHE_SIZE = 128


def cached_partition(length: int, groups: int, mode: str, device: torch.device) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`compute_partition` of an unpadded sequence in a deterministic mode, memoised.

    ``contiguous`` and ``strided`` partitions of L unpadded tokens depend only on
    (L, G, mode), so they are computed once per device (least-recently-used cache of
    128 entries) instead of in every forward. Returns (slots, slot_valid, inverse), batch 1.
    The tensors are shared: do not modify them.
    """
    if mode not in ("contiguous", "strided"):
        raise ValueError(f"only deterministic partitions can be cached, got {mode!r}")
    return _cached(("partition", length, groups, mode), device,
                   lambda: compute_partition(None, length, groups, mode, device))


def cached_group_mask(length: int, groups: int, mode: str, device: torch.device) -> Tensor:
    """(1, 1, L, L) bool, True where query i and key j share a group, for L unpadded tokens
    in a ``contiguous`` or ``strided`` partition; memoised like :func:`cached_partition`."""
    if mode not in ("contiguous", "strided"):
        raise ValueError(f"only deterministic partitions can be cached, got {mode!r}")

    def make():
        group = group_of_position(None, length, groups, device, mode)[0]
        return (group[:, None] == group[None, :])[None, None]

    return _cached(("mask", length, groups, mode), device, make)


def _cached(key: tuple, device, make):
    """Least-recently-used memo of small index/mask tensors, per device.

    Under ``torch.compile`` or while a CUDA graph is being captured nothing is read from or
    added to the cache: a graph records raw addresses, and a cached tensor that the graph
    read could later be evicted and its memory reused while the graph still replays it (and
    one first made during capture would live in the graph's private memory pool). The
    tensors are then made in place, as part of the compiled or captured code.
    """
    if is_compiling() or is_capturing_cuda_graph(device):
        return make()
    key = key + (torch.device(device),)
    hit = _CACHE.get(key)
    if hit is None:
        # ordinary tensors even when called under inference_mode, so that a later
        # training forward may save them for backward
        with torch.inference_mode(False), torch.no_grad():
            hit = make()
        _CACHE[key] = hit
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return hit
