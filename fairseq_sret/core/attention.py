"""Sliced group multi-head attention: the single attention module of fairseq-sret.

Used by the NMT encoder (self-attention), the NMT decoder (causal self-attention with an
incremental cache, and cross-attention) and the vision models.
"""

from typing import Optional, Sequence, Tuple, Union

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from .cache import AttentionCache
from .config import ONE_QUERY_MATMUL, get_fast_paths, is_compiling
from .linear import has_plain_weight, linear
from .partition import cached_group_mask, cached_partition, compute_partition, group_of_position
from .schedule import RecursionSchedule, RecursionStep


# Sliced attention over sequences of at most this many tokens runs as one attention kernel
# over the whole sequence with a group mask (the same function) instead of packing the
# groups: (unpadded, padded) per device type. Short sequences make the packed kernels
# launch- and memory-bound, and a padded batch would need a partition (sort, scatters,
# gathers) in every forward, while masked full attention over L tokens stays cheap.
# The limits are where the one kernel stopped being faster in benchmarks.bench_attention
# (docs/benchmarks/attention.md). ``fast_paths(grouped_one_kernel=N)`` sets both (0 = never).
ONE_KERNEL_MAX_LENGTH = {"cpu": (32, 128), "cuda": (256, 512)}


class SlicedGroupAttention(nn.Module):
    """Multi-head attention whose queries and keys are partitioned into groups.

    With ``groups[r] = G`` at recursion ``r``, the tokens of each sequence are split into
    G groups (see :mod:`fairseq_sret.core.partition`) and every token attends only to the
    tokens of its own group; outputs come back in the input order. ``G = 1`` is standard
    multi-head attention (Vaswani et al., the paper's Eq. 2).

    Args:
        embed_dim: model width C.
        num_heads: H, must divide C.
        groups: group count per recursion index, e.g. ``(8, 2)`` or ``"8,2"``; one value
            means the same for every recursion that is asked for.
        partition: partition mode per recursion (``contiguous``, ``strided``, ``random``,
            or ``auto``); a single value applies to all.
        causal: mask future positions (decoder self-attention).
        cross_attention: queries attend to a separate key/value sequence (groups must be 1).
        bias: bias on the input and output projections.
        out_bias: bias on the output projection alone (None: as ``bias``); CCT's
            attention has ``bias=False, out_bias=True``.
        dropout: dropout on the attention probabilities.
        schedule: a :class:`~fairseq_sret.core.schedule.RecursionSchedule` instead of
            ``groups``/``partition`` (its group counts and partition modes are taken).

    The module keeps only how each recursion slices (:attr:`groups`, :attr:`partition`);
    which applications run is the schedule of the :class:`~fairseq_sret.core.Recursive`
    layer that applies it, which passes each application's
    :class:`~fairseq_sret.core.schedule.RecursionStep` as ``recursion``. An int recursion
    index looks its slicing up here.

    Parameters: ``qkv`` (3C x C, rows ordered q, k, v as in ``nn.MultiheadAttention``'s
    ``in_proj_weight``) and ``out_proj`` (C x C).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        groups: Union[int, Sequence[int]] = 1,
        partition: Union[str, Sequence[str]] = "contiguous",
        causal: bool = False,
        cross_attention: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        schedule: Optional[RecursionSchedule] = None,
        out_bias: Optional[bool] = None,
    ):
        super().__init__()
        if num_heads < 1 or embed_dim % num_heads != 0:
            raise ValueError(
                f"num_heads={num_heads} must be >= 1 and divide embed_dim={embed_dim}"
            )
        if schedule is None:
            schedule = RecursionSchedule.parse(groups=groups, partition=partition, causal=causal)
        elif causal and not schedule.causal:
            schedule = RecursionSchedule.parse(
                len(schedule), groups=schedule.groups, partition=schedule.partitions, causal=causal
            )
        if cross_attention and any(g != 1 for g in schedule.groups):
            raise ValueError("cross-attention does not support groups > 1")
        #: group count and partition mode per recursion index (one entry: every recursion)
        self.groups: Tuple[int, ...] = schedule.groups
        self.partition: Tuple[str, ...] = schedule.partitions
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.causal = causal
        self.cross_attention = cross_attention
        self.dropout = dropout
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias if out_bias is None else out_bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """fairseq's initialisation: Xavier-uniform per q/k/v block (gain 1/sqrt 2), zero biases."""
        for block in self.qkv.weight.data.chunk(3, dim=0):
            nn.init.xavier_uniform_(block, gain=2 ** -0.5)
        nn.init.xavier_uniform_(self.out_proj.weight)
        for layer in (self.qkv, self.out_proj):
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)

    def step(self, recursion: Union[int, RecursionStep]) -> RecursionStep:
        """The slicing of application ``recursion`` (a step is returned as it is; with one
        entry in :attr:`groups`, every index gets it)."""
        if isinstance(recursion, RecursionStep):
            return recursion
        if len(self.groups) == 1:
            return RecursionStep(recursion, self.groups[0], self.partition[0])
        if not 0 <= recursion < len(self.groups):
            raise IndexError(
                f"recursion index {recursion} out of range: the module slices {len(self.groups)} recursions"
            )
        return RecursionStep(recursion, self.groups[recursion], self.partition[recursion])

    def groups_at(self, recursion: Union[int, RecursionStep]) -> int:
        return self.step(recursion).groups

    def partition_at(self, recursion: Union[int, RecursionStep]) -> str:
        return self.step(recursion).partition

    def extra_repr(self) -> str:
        slicing = ", ".join(f"{g} {p}" for g, p in zip(self.groups, self.partition))
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, groups=[{slicing}],"
            f" causal={self.causal}, cross={self.cross_attention}"
        )

    # ------------------------------------------------------------------ projections
    def _split_heads(self, x: Tensor) -> Tensor:
        """(B, L, C) -> (B, H, L, d)"""
        b, l, _ = x.shape
        return x.view(b, l, self.num_heads, self.head_dim).transpose(1, 2)

    def _merge_heads(self, x: Tensor) -> Tensor:
        """(B, H, L, d) -> (B, L, C)"""
        b, _, l, _ = x.shape
        return x.transpose(1, 2).reshape(b, l, self.embed_dim)

    def _project_kv(self, memory: Tensor) -> Tuple[Tensor, Tensor]:
        c = self.embed_dim
        if not has_plain_weight(self.qkv):  # quantized (core.int8): project all three, keep k, v
            k, v = linear(memory, self.qkv)[..., c:].chunk(2, dim=-1)
        else:
            bias = self.qkv.bias[c:] if self.qkv.bias is not None else None
            k, v = F.linear(memory, self.qkv.weight[c:], bias).chunk(2, dim=-1)
        return self._split_heads(k), self._split_heads(v)

    def _project_q(self, x: Tensor) -> Tensor:
        c = self.embed_dim
        if not has_plain_weight(self.qkv):
            return self._split_heads(linear(x, self.qkv)[..., :c])
        bias = self.qkv.bias[:c] if self.qkv.bias is not None else None
        return self._split_heads(F.linear(x, self.qkv.weight[:c], bias))

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], is_causal: bool,
        every_row_has_key: bool = False,
    ) -> Tensor:
        """SDPA with rows that have no allowed key zeroed instead of NaN.

        q: (N, H, Lq, d); k, v: (N, H, Lk, d); mask: bool, True = may attend, broadcastable
        to (N, H, Lq, Lk). ``every_row_has_key``: the caller knows that every query may
        attend to some key (no fix-up needed).
        """
        dropout = self.dropout if self.training else 0.0
        attend = _attend_one_query if _one_query_by_matmul(q, dropout, is_causal) else _sdpa
        if mask is None or every_row_has_key:
            return attend(q, k, v, mask, dropout, is_causal)
        row_has_key = mask.any(dim=-1, keepdim=True)
        safe_mask = mask | ~row_has_key
        out = attend(q, k, v, safe_mask, dropout, False)
        # Zero the rows without keys. On accelerators multiply unconditionally (exact: x * 1
        # is x) rather than read ``row_has_key.all()``, a device-to-host sync; so too while
        # torch.compile / torch.export (ONNX) trace, where the value is not known.
        if out.device.type != "cpu" or is_compiling() or not bool(row_has_key.all()):
            out = out * row_has_key.to(out.dtype)
        return out

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        x: Tensor,
        memory: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        recursion: Union[int, RecursionStep] = 0,
        cache: Optional[AttentionCache] = None,
    ) -> Tensor:
        """Attend from ``x`` to itself (or to ``memory`` for cross-attention).

        Args:
            x: (B, L, C) queries (and keys/values for self-attention).
            memory: (B, Lk, C) keys/values for cross-attention.
            key_padding_mask: (B, Lk) bool, True marks padding keys.
            recursion: the current application of the shared layer, a
                :class:`RecursionStep` or its index (:meth:`step`); selects the group
                count and partition mode.
            cache: an :class:`~fairseq_sret.core.cache.AttentionCache` owned by the caller
                for incremental decoding (one per layer application). Self-attention appends
                this step's keys and values; cross-attention stores the projected memory once.
        Returns:
            (B, L, C)
        """
        step = self.step(recursion)
        if self.cross_attention:
            return self._forward_cross(x, memory, key_padding_mask, cache)
        if memory is not None:
            raise ValueError("memory is only used by cross-attention modules")
        if cache is not None:
            return self._forward_incremental(x, key_padding_mask, step, cache)
        return _self_attention(self, x, key_padding_mask, step.groups, step.partition)

    def _forward_self(self, x: Tensor, key_padding_mask: Optional[Tensor], groups: int, partition: str) -> Tensor:
        """Self-attention of x (B, L, C) without a cache, ``groups`` groups in ``partition`` mode."""
        batch, length, _ = x.shape
        groups = min(groups, length)
        qkv = linear(x, self.qkv)
        if groups > 1:
            return linear(self._forward_grouped(qkv, key_padding_mask, partition, groups), self.out_proj)
        # (B, L, 3C) -> 3 x (B, H, L, d): the same views as chunk + per-head views, in fewer
        # operations (forward and backward; the projections dominate only for long inputs)
        q, k, v = qkv.view(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        mask = None
        if key_padding_mask is not None:
            mask = ~key_padding_mask[:, None, None, :]
            if self.causal:
                mask = mask & torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        out = self._attend(q, k, v, mask, is_causal=self.causal and mask is None)
        return linear(self._merge_heads(out), self.out_proj)

    def _forward_grouped(
        self, qkv: Tensor, key_padding_mask: Optional[Tensor], mode: str, groups: int
    ) -> Tensor:
        """qkv: (B, L, 3C) projected input -> attention output (B, L, C) before out_proj."""
        batch, length, _ = qkv.shape
        channels = self.embed_dim
        if self.causal and mode == "contiguous":
            raise ValueError(
                "causal attention cannot use the 'contiguous' partition with groups > 1: slice"
                " boundaries depend on the final length; use 'strided' or 'random'"
            )
        if mode == "random" and not self.training:
            mode = "strided"
        valid = None if key_padding_mask is None else ~key_padding_mask
        if mode != "random" and length <= self._one_kernel_max_length(qkv.device, valid is not None):
            return self._forward_grouped_masked(qkv, valid, mode, groups)
        if mode == "random" and valid is None and not self.causal and length % groups == 0:
            return self._forward_grouped_shuffled(qkv, groups)
        # Without padding, equal slices are plain reshapes (no gather, no index tensors):
        # contiguous slice g holds positions g*S .. g*S+S-1, strided group g positions
        # g, g+G, g+2G, ... (position s*G+g is slot s of group g).
        layout = None
        if valid is None and length % groups == 0 and mode in ("contiguous", "strided"):
            layout = mode
        if layout is not None:
            width = length // groups
            slot_valid = inverse = None
            if layout == "contiguous":
                packed = qkv
            else:
                packed = qkv.view(batch, width, groups, 3 * channels).transpose(1, 2)
        else:
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
            key_ok = slot_valid.view(-1, groups, width).expand(batch, -1, -1).reshape(batch * groups, 1, 1, width)
            mask = key_ok
            if self.causal:
                # positions increase inside a group and empty slots sit at the end, so the
                # slot order is the causal order
                mask = mask & torch.ones(width, width, dtype=torch.bool, device=qkv.device).tril()
        out = self._attend_slices(packed.reshape(batch * groups, width, 3 * channels), mask)
        if layout == "contiguous":
            return out.reshape(batch, length, channels)
        if layout == "strided":
            return out.reshape(batch, groups, width, channels).transpose(1, 2).reshape(batch, length, channels)
        out = out.reshape(batch, groups * width, channels)
        if inverse.size(0) == 1:
            out = out.index_select(1, inverse[0])
        else:
            out = out.gather(1, inverse.unsqueeze(-1).expand(-1, -1, channels))
        if valid is not None:
            out = out * valid.unsqueeze(-1).to(out.dtype)
        return out

    def _forward_grouped_shuffled(self, qkv: Tensor, groups: int) -> Tensor:
        """The random partition of unpadded tokens into equal groups, as the official code
        draws it: one random permutation of the positions, whose consecutive slices are the
        groups. The same groups as :func:`~fairseq_sret.core.partition.compute_partition`
        draws from the same random numbers; only the order inside a group differs, which
        non-causal attention does not see. Four operations (draw, sort, gather, scatter back)
        instead of the general partition's dozens. qkv: (B, L, 3C) -> (B, L, C) before out_proj."""
        batch, length, _ = qkv.shape
        width, channels = length // groups, self.embed_dim
        order = torch.rand(length, device=qkv.device).argsort()
        packed = qkv.index_select(1, order).view(batch * groups, width, 3 * channels)
        out = self._attend_slices(packed, None).reshape(batch, length, channels)  # slot order
        return torch.empty_like(out).index_copy_(1, order, out)

    def _attend_slices(self, packed: Tensor, mask: Optional[Tensor]) -> Tensor:
        """Attention inside each slice: packed (N, S, 3C) projected q/k/v of N slices (groups)
        of S slots, mask None or broadcastable to (N, H, S, S) -> (N, S, H, d)."""
        slices, width, _ = packed.shape
        q, k, v = packed.view(slices, width, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return self._attend(q, k, v, mask, is_causal=self.causal and mask is None).permute(0, 2, 1, 3)

    @staticmethod
    def _one_kernel_max_length(device: torch.device, padded: bool) -> int:
        chosen = get_fast_paths().grouped_one_kernel
        if chosen is None:
            return ONE_KERNEL_MAX_LENGTH.get(device.type, (0, 0))[int(padded)]
        return chosen

    def _forward_grouped_masked(self, qkv: Tensor, valid: Optional[Tensor], mode: str, groups: int) -> Tensor:
        """The grouped attention of :meth:`_forward_grouped` as one attention call over the
        whole sequence: key j is allowed for query i when both are real tokens of the same
        group (and j <= i when causal). No packing, gathers or partition tensors.
        qkv: (B, L, 3C) -> (B, L, C) before out_proj."""
        batch, length, _ = qkv.shape
        q, k, v = qkv.view(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if valid is None:
            mask = cached_group_mask(length, groups, mode, qkv.device)
        else:
            group = group_of_position(valid, length, groups, qkv.device, mode)  # (B, L), -1 = padding
            mask = (group[:, None, :, None] == group[:, None, None, :]) & valid[:, None, None, :]
        if self.causal:
            mask = mask & torch.ones(length, length, dtype=torch.bool, device=qkv.device).tril()
        # unpadded, every query attends at least to itself
        out = self._merge_heads(self._attend(q, k, v, mask, is_causal=False, every_row_has_key=valid is None))
        if valid is not None:
            out = out * valid.unsqueeze(-1).to(out.dtype)
        return out

    def _forward_incremental(
        self, x: Tensor, key_padding_mask: Optional[Tensor], step: RecursionStep, cache: AttentionCache
    ) -> Tensor:
        """Causal self-attention for new steps x (B, T_new, C) given cached keys/values."""
        if not self.causal:
            raise ValueError("incremental decoding needs a causal self-attention module")
        groups = step.groups
        if groups > 1 and step.partition == "random" and self.training:
            raise RuntimeError(
                "incremental decoding with a random partition needs eval() mode (the"
                " deterministic strided partition); call model.eval() before decoding"
            )
        q, k, v = (self._split_heads(t) for t in linear(x, self.qkv).chunk(3, dim=-1))
        k, v = cache.key_values.update(k, v)
        total, new = k.size(2), q.size(2)
        key_padding_mask = self._extend_cached_padding(key_padding_mask, cache, total, new)
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
        out = self._attend(q, k, v, mask, is_causal=False)
        return linear(self._merge_heads(out), self.out_proj)

    @staticmethod
    def _extend_cached_padding(
        key_padding_mask: Optional[Tensor], cache: AttentionCache, total: int, new: int
    ) -> Optional[Tensor]:
        """Padding mask over cache + new steps; accepts a mask for the new steps only."""
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

    def _forward_cross(
        self, x: Tensor, memory: Optional[Tensor], key_padding_mask: Optional[Tensor],
        cache: Optional[AttentionCache],
    ) -> Tensor:
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
            k, v = self._project_kv(memory)
            mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
            every_row_has_key = False
            if cache is not None:
                # the memory's keys, values and mask are the same at every decoding step:
                # computed, and checked for sources that are all padding, once
                every_row_has_key = mask is None or (not is_compiling() and bool(mask.any(dim=-1).all()))
                # contiguous once, so that no decoding step copies them for its matrix products
                k, v = cache.key_values.update(k.contiguous(), v.contiguous())
                cache.memory_mask, cache.every_row_has_key = mask, every_row_has_key
        q = self._project_q(x)
        out = self._attend(q, k, v, mask, is_causal=False, every_row_has_key=every_row_has_key)
        return linear(self._merge_heads(out), self.out_proj)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout: float, is_causal: bool) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal)


def _one_query_by_matmul(q: Tensor, dropout: float, is_causal: bool) -> bool:
    """Whether :func:`_attend_one_query` computes this attention (``fast_paths(one_query_attention=...)``)."""
    return q.size(-2) == 1 and dropout == 0.0 and not is_causal and get_fast_paths().one_query_attention == ONE_QUERY_MATMUL


def _attend_one_query(
    q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout: float = 0.0, is_causal: bool = False
) -> Tensor:
    """softmax(q k^T / sqrt(d)) v for one query per row, as two matrix products (the paper's
    Eq. 2), the way fairseq's decoder computes a decoding step.

    q: (N, H, 1, d); k, v: (N, H, Lk, d); mask: bool, True = may attend, broadcastable to
    (N, H, 1, Lk), at least one allowed key per row. Returns (N, H, 1, d). A few small kernels
    whose cost follows the work, where SDPA's are built for many queries
    (:class:`~fairseq_sret.core.config.FastPaths`).
    """
    scores = torch.matmul(q * q.size(-1) ** -0.5, k.transpose(-2, -1))
    if mask is not None:
        scores = torch.where(mask, scores, float("-inf"))  # one kernel; masked_fill needs ~mask first
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _self_attention(
    module: SlicedGroupAttention, x: Tensor, key_padding_mask: Optional[Tensor], groups: int, partition: str
) -> Tensor:
    """``module``'s self-attention of ``x`` without a cache. A function, so that a ``torch.fx``
    trace records it as one call (``torch.fx.wrap`` below): how the groups are packed depends
    on the sequence length, which a symbolic trace does not know; the graph decides it when it
    runs, exactly as eager mode does."""
    return module._forward_self(x, key_padding_mask, groups, partition)


torch.fx.wrap("_self_attention")
