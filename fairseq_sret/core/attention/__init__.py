"""The attention of SReT's blocks, as a seam: attention layers registered by name, the ways
of computing grouped self-attention and the attention kernels, each a function of one
signature registered by name (:mod:`.registry`).

- :class:`SlicedGroupAttention` (:mod:`.sliced_group`): the default layer, ``"sliced_group"``;
- :mod:`.grouped`: grouped self-attention, ``fn(attn, qkv, valid, groups, mode)``
  (``one_kernel``, ``shuffled``, ``packed``; :data:`ONE_KERNEL_MAX_LENGTH`);
- :mod:`.kernels`: ``fn(q, k, v, mask, dropout, is_causal)`` (``sdpa``, ``one_query_matmul``);
- :mod:`.decoding`: incremental self-attention and cross-attention over a cache.

An attention layer registered with :func:`register_attention_layer` is what
``SReTLayerSpec(attention=name)`` builds its blocks with (:class:`~fairseq_sret.core.SReTBlock`
takes the class as ``attn_layer``). The block constructs it with keywords::

    layer(embed_dim, num_heads, groups=..., partition=..., schedule=..., causal=...,
          cross_attention=False, bias=..., dropout=..., out_bias=...)

(self-attention: the block's ``groups``/``partition``, or its ``schedule`` to take them from;
cross-attention: ``groups=1``, ``cross_attention=True``, no schedule), ``bias`` the q/k/v
projections' bias, ``out_bias`` the output projection's (None: as ``bias``), ``dropout`` on
the attention probabilities. The block calls::

    layer(x, memory=None, key_padding_mask=None, recursion=step, cache=None) -> (B, L, C)

x (B, L, C); memory (B, Lk, C) for cross-attention; key_padding_mask (B, L or Lk) True at
padding; recursion the application's :class:`~fairseq_sret.core.RecursionStep` (its groups
and partition); cache an :class:`~fairseq_sret.core.AttentionCache` (incremental decoding; a
layer that cannot decode raises). It reads from the layer: ``out_proj``, the branch's last
``nn.Linear`` (LRC folding, :func:`~fairseq_sret.core.fold_lrc`), and ``groups``,
``partition`` (a tuple per recursion) and ``causal`` (the schedule of a
:class:`~fairseq_sret.core.Recursive` given only a count). A layer that uses fast-path
switches reads them when built (:func:`~fairseq_sret.core.config.follow_fast_paths`).
"""

from . import decoding, grouped, kernels  # noqa: F401  (register the strategies and kernels)
from .grouped import ONE_KERNEL_MAX_LENGTH
from .kernels import attend_one_query, one_query_by_matmul, sdpa
from .registry import (
    ATTENTION_KERNELS, ATTENTION_LAYERS, DEFAULT_ATTENTION_LAYER, GROUPED_ATTENTION, Registry, attention_layer,
    register_attention_layer,
)
from .sliced_group import SlicedGroupAttention

__all__ = [
    "ATTENTION_KERNELS",
    "ATTENTION_LAYERS",
    "DEFAULT_ATTENTION_LAYER",
    "GROUPED_ATTENTION",
    "ONE_KERNEL_MAX_LENGTH",
    "Registry",
    "SlicedGroupAttention",
    "attend_one_query",
    "attention_layer",
    "one_query_by_matmul",
    "register_attention_layer",
    "sdpa",
]
