"""Sliced group multi-head attention: the default attention layer of fairseq-sret
(``"sliced_group"``), used by the NMT encoder (self-attention), the NMT decoder (causal
self-attention with an incremental cache, and cross-attention) and the vision models."""

from typing import Optional, Sequence, Tuple, Union

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from ..cache import AttentionCache
from ..config import ONE_QUERY_MATMUL, FastPaths, follow_fast_paths
from ..linear import has_plain_weight, linear
from ..schedule import RecursionSchedule, RecursionStep
from .decoding import cross_attention, incremental_self_attention
from .grouped import grouped_strategy
from .kernels import attend
from .registry import GROUPED_ATTENTION, register_attention_layer


@register_attention_layer("sliced_group")
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

    The fast-path switches it uses (``grouped_one_kernel``, ``one_query_attention``) are read
    when it is built, into :attr:`one_kernel_max_length` and :attr:`one_query_matmul`
    (:func:`~fairseq_sret.core.config.apply_fast_paths` changes them on a built model).

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
        follow_fast_paths(self)

    def read_fast_paths(self, paths: FastPaths) -> None:
        """Take the switches this module uses from ``paths`` (at build, and when they change:
        :mod:`fairseq_sret.core.config`)."""
        #: the longest sliced sequence computed as one masked kernel (None: the device's default)
        self.one_kernel_max_length: Optional[int] = paths.grouped_one_kernel
        #: a decoding step's attention as two matrix products (else SDPA)
        self.one_query_matmul: bool = paths.one_query_attention == ONE_QUERY_MATMUL

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        # a copy keeps its choices and follows changes; one pickled before it had any reads them
        follow_fast_paths(self, read_now="one_query_matmul" not in state)

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
        """This module's attention kernel (:func:`~fairseq_sret.core.attention.kernels.attend`):
        q (N, H, Lq, d), k, v (N, H, Lk, d), mask bool True = may attend; rows without a key
        are zero."""
        dropout = self.dropout if self.training else 0.0
        return attend(q, k, v, mask, dropout, is_causal, every_row_has_key, self.one_query_matmul)

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
            return cross_attention(self, x, memory, key_padding_mask, cache)
        if memory is not None:
            raise ValueError("memory is only used by cross-attention modules")
        if cache is not None:
            return incremental_self_attention(self, x, key_padding_mask, step, cache)
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

    def _forward_grouped(self, qkv: Tensor, key_padding_mask: Optional[Tensor], mode: str, groups: int) -> Tensor:
        """qkv: (B, L, 3C) projected input -> attention output (B, L, C) before out_proj, by
        the strategy :func:`~fairseq_sret.core.attention.grouped.grouped_strategy` picks."""
        if self.causal and mode == "contiguous":
            raise ValueError(
                "causal attention cannot use the 'contiguous' partition with groups > 1: slice"
                " boundaries depend on the final length; use 'strided' or 'random'"
            )
        if mode == "random" and not self.training:
            mode = "strided"
        valid = None if key_padding_mask is None else ~key_padding_mask
        strategy = GROUPED_ATTENTION[grouped_strategy(self, qkv, valid, groups, mode)]
        return strategy(self, qkv, valid, groups, mode)


def _self_attention(
    module: SlicedGroupAttention, x: Tensor, key_padding_mask: Optional[Tensor], groups: int, partition: str
) -> Tensor:
    """``module``'s self-attention of ``x`` without a cache. A function, so that a ``torch.fx``
    trace records it as one call (``torch.fx.wrap`` below): how the groups are packed depends
    on the sequence length, which a symbolic trace does not know; the graph decides it when it
    runs, exactly as eager mode does."""
    return module._forward_self(x, key_padding_mask, groups, partition)


torch.fx.wrap("_self_attention")
