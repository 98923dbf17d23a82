"""The transformer layer that SReT re-applies (paper Eq. 1 with LRC, Eq. 7)."""

from typing import Callable, List, Optional, Sequence, Tuple, Union

from torch import Tensor, nn

from .attention import SlicedGroupAttention
from .cache import AttentionCache, BlockCache, block_caches
from .drop_path import DropPath
from .feedforward import FeedForward
from .fold import FoldsLRC
from .residual import LearnableResidual
from .schedule import RecursionSchedule, RecursionStep



class SReTBlock(FoldsLRC, nn.Module):
    """Self-attention [+ cross-attention] + FFN, each a residual sub-layer with LRC.

    Pre-LN (``normalize_before=True``, the paper's Eq. 1): ``x = res(x, drop(f(LN(x))))``.
    Post-LN (fairseq's NMT default): ``x = LN(res(x, drop(f(x))))``.
    ``res`` is :class:`LearnableResidual` (plain ``x + f(x)`` when ``lrc=False``).

    ``normalize_stream_before_ffn`` (pre-LN only): the stream itself is normalised between
    the attention and the FFN, ``x = LN(x); x = res(x, drop(FFN(x)))``, so the FFN's skip is
    the normalised stream: the layer of the Compact Convolutional Transformer (Hassani et
    al., arXiv:2104.05704). ``qkv_bias``: bias of the attention's input projections, and of
    its output projections unless ``out_proj_bias`` is given (CCT: ``qkv_bias=False,
    out_proj_bias=True``).

    ``groups``/``partition`` (or a ``schedule`` to take them from) say how the
    self-attention of each application slices; the layer that re-applies this block (a
    :class:`~fairseq_sret.core.Recursive`, which keeps the schedule of what runs) passes each
    application's :class:`RecursionStep` as ``recursion``, and the block hands it to every
    sub-module.

    Sub-modules: ``self_attn``, ``self_attn_norm``, ``self_attn_residual``; with
    ``cross_attention``: ``cross_attn``, ``cross_attn_norm``, ``cross_attn_residual``;
    then ``ffn``, ``ffn_norm``, ``ffn_residual``.

    The layers are injected, as in timm's ``Block``: ``attn_layer`` (the attention class,
    constructed and called as :mod:`fairseq_sret.core.attention` describes; default
    :class:`SlicedGroupAttention`), ``mlp_layer`` (``mlp_layer(embed_dim, ffn_dim,
    activation, activation_dropout)``, called ``ffn(h, recursion=step)``, its last linear
    ``fc2``; default :class:`FeedForward`) and ``norm_layer`` (``norm_layer(embed_dim,
    eps=norm_eps)``, a LayerNorm: the fused residual + LayerNorm kernel and LRC folding read
    its weight, bias and eps; default ``nn.LayerNorm``).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        ffn_dim: int,
        groups: Union[int, Sequence[int]] = 1,
        partition: Union[str, Sequence[str]] = "contiguous",
        causal: bool = False,
        cross_attention: bool = False,
        normalize_before: bool = True,
        lrc: bool = True,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        activation: str = "gelu",
        qkv_bias: bool = True,
        drop_path: float = 0.0,
        norm_eps: float = 1e-5,
        schedule: Optional[RecursionSchedule] = None,
        out_proj_bias: Optional[bool] = None,
        normalize_stream_before_ffn: bool = False,
        attn_layer: Callable[..., nn.Module] = SlicedGroupAttention,
        mlp_layer: Callable[..., nn.Module] = FeedForward,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
    ):
        super().__init__()
        if normalize_stream_before_ffn and not normalize_before:
            raise ValueError("normalize_stream_before_ffn is an option of pre-LN blocks (normalize_before=True)")
        self.normalize_before = normalize_before
        self.normalize_stream_before_ffn = normalize_stream_before_ffn
        # parameters are created in this order (seeded initialisation depends on it)
        self.self_attn = attn_layer(
            embed_dim, num_heads, groups=groups, partition=partition, schedule=schedule, causal=causal,
            cross_attention=False, bias=qkv_bias, dropout=attention_dropout, out_bias=out_proj_bias,
        )
        self.self_attn_norm = norm_layer(embed_dim, eps=norm_eps)
        self.self_attn_residual = LearnableResidual(lrc)
        self.cross_attn = None
        if cross_attention:
            self.cross_attn = attn_layer(
                embed_dim, num_heads, groups=1, partition="contiguous", schedule=None, causal=False,
                cross_attention=True, bias=qkv_bias, dropout=attention_dropout, out_bias=out_proj_bias,
            )
            self.cross_attn_norm = norm_layer(embed_dim, eps=norm_eps)
            self.cross_attn_residual = LearnableResidual(lrc)
        self.ffn = mlp_layer(embed_dim, ffn_dim, activation, activation_dropout)
        self.ffn_norm = norm_layer(embed_dim, eps=norm_eps)
        self.ffn_residual = LearnableResidual(lrc)
        self.dropout = nn.Dropout(dropout)
        self.drop_path = DropPath(drop_path)

    def _post_ln_sublayer(self, x: Tensor, norm: nn.LayerNorm, residual: LearnableResidual, fn: Callable) -> Tensor:
        """One post-LN residual sub-layer around ``fn``: ``LN(res(x, drop(f(x))))`` (paper Eq. 7)."""
        return norm(residual(x, self.drop_path(self.dropout(fn(x)))))

    def recursion_schedule(self, recursions: int) -> RecursionSchedule:
        """A schedule of ``recursions`` applications of this block, slicing as it was built to
        (what :class:`~fairseq_sret.core.Recursive` takes when given only a count)."""
        attn = self.self_attn
        return RecursionSchedule.parse(recursions, groups=attn.groups, partition=attn.partition, causal=attn.causal)

    def new_caches(self, applications: int) -> List[BlockCache]:
        """Empty incremental caches for ``applications`` applications of this block
        (:func:`~fairseq_sret.core.cache.block_caches`: one self-attention cache each, one
        cross-attention cache shared by all)."""
        return block_caches(applications, cross_attention=self.cross_attn is not None)

    def lrc_sublayers(self):
        """(LayerNorm, residual, last linear of the branch) per residual sub-layer, in order
        (read by :func:`fairseq_sret.core.fold_lrc`)."""
        subs = [(self.self_attn_norm, self.self_attn_residual, self.self_attn.out_proj)]
        if self.cross_attn is not None:
            subs.append((self.cross_attn_norm, self.cross_attn_residual, self.cross_attn.out_proj))
        subs.append((self.ffn_norm, self.ffn_residual, self.ffn.fc2))
        return subs

    @property
    def input_norm(self) -> nn.LayerNorm:
        """The LayerNorm that reads the block's input (pre-LN)."""
        return self.self_attn_norm

    @property
    def chains_norms(self) -> bool:
        """Whether ``forward`` takes ``normed`` / ``next_norm`` (pre-LN blocks)."""
        return self.normalize_before

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        memory: Optional[Tensor] = None,
        memory_padding_mask: Optional[Tensor] = None,
        recursion: Union[int, RecursionStep] = 0,
        cache: Optional[BlockCache] = None,
        normed: Optional[Tensor] = None,
        next_norm: Optional[nn.LayerNorm] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """x: (B, L, C); memory: (B, Lk, C); masks True at padding. Returns (B, L, C).

        ``recursion``: this application's :class:`RecursionStep` (or its recursion index),
        passed to every sub-module.

        ``cache`` (incremental decoding): this application's :class:`~fairseq_sret.core.cache.BlockCache`,
        owned by the caller; one attention cache per attention module.

        Pre-LN only, for callers that chain layers through the fused residual + LayerNorm
        kernel (:class:`Recursive` does): ``normed`` is ``self.self_attn_norm(x)``, already
        computed by the caller; with ``next_norm`` the block returns ``(x, next_norm(x))``,
        the LayerNorm computed together with the last residual.

        In a pre-LN block every residual is computed together with the LayerNorm of the next
        sub-layer (:meth:`LearnableResidual.forward_norm`): one kernel on CUDA with Triton,
        otherwise exactly ``res(x, f)`` followed by ``norm``.
        """
        self_cache = cross_cache = None
        if cache is not None:
            if self.cross_attn is not None and cache.cross_attn is None:
                cache.cross_attn = AttentionCache()
            self_cache, cross_cache = cache.self_attn, cache.cross_attn

        def self_attn(h: Tensor) -> Tensor:
            return self.self_attn(h, key_padding_mask=key_padding_mask, recursion=recursion, cache=self_cache)

        def cross_attn(h: Tensor) -> Tensor:
            return self.cross_attn(
                h, memory=memory, key_padding_mask=memory_padding_mask, recursion=recursion, cache=cross_cache
            )

        def ffn(h: Tensor) -> Tensor:
            return self.ffn(h, recursion=recursion)

        sublayers = [(self.self_attn_norm, self.self_attn_residual, self_attn)]
        if self.cross_attn is not None:
            sublayers.append((self.cross_attn_norm, self.cross_attn_residual, cross_attn))
        sublayers.append((self.ffn_norm, self.ffn_residual, ffn))

        if not self.normalize_before:
            if normed is not None or next_norm is not None:
                raise ValueError("normed / next_norm are for pre-LN blocks (normalize_before=True)")
            for norm, residual, fn in sublayers:
                x = self._post_ln_sublayer(x, norm, residual, fn)
            return x

        h = normed if normed is not None else self.self_attn_norm(x)
        last = len(sublayers) - 1
        for i, (_, residual, fn) in enumerate(sublayers):
            if i == last and self.normalize_stream_before_ffn:
                x = h  # the FFN's skip is the normalised stream (CCT)
            branch = self.drop_path(self.dropout(fn(h)))
            following = sublayers[i + 1][0] if i + 1 < len(sublayers) else next_norm
            if following is None:
                x = residual(x, branch)
            else:
                x, h = residual.forward_norm(x, branch, following)
        return (x, h) if next_norm is not None else x
