"""What a translation model's recursive SReT layers are, as typed values.

The framework adapters (the fairseq model, the transformers model) are each one function from
their framework's configuration to an :class:`EncoderDecoderSpec` (a :class:`SideSpec` per
side, as fairseq's ``EncDecBaseConfig``), and every unique layer is built from it: options ->
spec -> modules, one direction. The words are the core's on every side: ``recursions`` is how
many applications a layer is built (and trained) with, one NLL each; ``depth`` how many of them
run (depth on demand). The spec holds the trained schedule at the depth that runs; the modules
built from it keep that schedule in one place, their :class:`~fairseq_sret.core.Recursive`
(which :func:`~fairseq_sret.core.set_depth` changes).
"""

import math
from dataclasses import dataclass, fields
from numbers import Integral, Real

from torch import nn

from .attention import ATTENTION_LAYERS, DEFAULT_ATTENTION_LAYER, attention_layer
from .block import SReTBlock
from .feedforward import ACTIVATIONS, NonLinearProjection
from .recursion import Recursive
from .schedule import RecursionSchedule


def _problem(field, value) -> str:
    """Why ``value`` cannot be the spec field ``field`` ('' if it can): the rule of the field's
    type (counts, flags, rates, the activation's name, nested specs), shared by every spec class
    (:func:`check_spec_fields`)."""
    number = isinstance(value, Real) and not isinstance(value, bool)
    if field.type is int:
        if not number or not isinstance(value, Integral) or value < 1:
            return "must be an integer >= 1"
    elif field.type is bool:
        if not isinstance(value, bool):
            return "must be True or False"
    elif field.name == "nll_ratio":
        if not number or not math.isfinite(value) or value < 0:
            return "must be a finite number >= 0 (0: no NLL)"
    elif field.name == "norm_eps":
        if not number or not math.isfinite(value) or value <= 0:
            return "must be a finite number > 0"
    elif field.type is float:  # dropout and stochastic depth rates
        if not number or not 0 <= value < 1:
            return "must be a number in [0, 1)"
    elif field.name == "activation":
        if not isinstance(value, str) or value not in ACTIVATIONS:
            return f"must be one of {', '.join(ACTIVATIONS)}"
    elif field.name == "attention":
        if not isinstance(value, str) or value not in ATTENTION_LAYERS:
            return f"must be a registered attention layer ({ATTENTION_LAYERS.names()})"
    elif isinstance(field.type, type) and not isinstance(value, field.type):
        return f"must be a {field.type.__name__}"
    return ""


def check_spec_fields(spec) -> None:
    """The one validation of the spec classes, run by each one's ``__post_init__``: every field
    checked for its type and range, a ValueError naming the first field that fails."""
    for field in fields(spec):
        value = getattr(spec, field.name)
        problem = _problem(field, value)
        if problem:
            shown = repr(value) if isinstance(value, (bool, int, float, str, type(None))) else f"a {type(value).__name__}"
            raise ValueError(f"{type(spec).__name__}.{field.name} {problem}, got {shown}")
    heads, dim = getattr(spec, "num_heads", None), getattr(spec, "embed_dim", None)
    if heads is not None and dim % heads:
        raise ValueError(f"{type(spec).__name__}.num_heads={heads} must divide embed_dim={dim}")


@dataclass(frozen=True)
class RecursionSpec:
    """How a shared block of width ``embed_dim`` is applied: ``len(schedule)`` times, a
    non-shared NLL of hidden ratio ``nll_ratio`` after every application (paper Eq. 6; 0: none)
    with LRC on its residual (``lrc``), ``checkpoint``: each application recomputed in the
    backward pass. What every recursive layer is built with (:class:`SReTLayerSpec` for
    SReT's blocks, the recursive MLP-Mixer for its own)."""

    embed_dim: int
    schedule: RecursionSchedule
    nll_ratio: float = 1.0
    lrc: bool = True
    activation: str = "gelu"
    dropout: float = 0.0
    activation_dropout: float = 0.0
    norm_eps: float = 1e-5
    checkpoint: bool = False

    def __post_init__(self):
        check_spec_fields(self)

    def apply(self, block: nn.Module) -> Recursive:
        """``block`` (freshly built) applied by the schedule, with freshly initialised NLLs."""
        make_nll = None
        if self.nll_ratio > 0:
            def make_nll(_index: int) -> NonLinearProjection:
                return NonLinearProjection(
                    self.embed_dim, self.nll_ratio, lrc=self.lrc, activation=self.activation,
                    dropout=self.dropout, activation_dropout=self.activation_dropout, norm_eps=self.norm_eps,
                )
        return Recursive(block, self.schedule, make_nll, checkpoint=self.checkpoint)


@dataclass(frozen=True)
class SReTLayerSpec:
    """One side's unique layer: a shared :class:`SReTBlock` (self-attention [+
    cross-attention] + FFN, LRC on every residual, paper Eq. 1, 7-8) applied as
    ``recursion`` says: ``len(schedule)`` times, an NLL of hidden ratio ``nll_ratio`` after
    every application (Eq. 6; 0: none).

    ``recursion`` holds the values the block shares with its NLLs (width, schedule, LRC,
    activation, dropouts, LayerNorm epsilon, checkpointing), each once; the spec reads them
    through properties of the same names (``spec.embed_dim``, ``spec.dropout``, ...).

    ``drop_path``: the block's stochastic depth rate (vision); ``qkv_bias``: bias of the
    attention's q/k/v projections (the output projections always have one);
    ``normalize_stream_before_ffn``: the stream itself is normalised between attention and
    FFN, the FFN's skip being the normalised stream (the Compact Convolutional Transformer,
    :class:`SReTBlock`). CCT's layer: ``qkv_bias=False, normalize_stream_before_ffn=True``.
    ``attention``: the name of the attention layer, as registered with
    :func:`~fairseq_sret.core.attention.register_attention_layer`.
    """

    recursion: RecursionSpec
    num_heads: int
    ffn_dim: int
    causal: bool = False
    cross_attention: bool = False
    normalize_before: bool = True
    attention_dropout: float = 0.0
    drop_path: float = 0.0
    qkv_bias: bool = True
    normalize_stream_before_ffn: bool = False
    attention: str = DEFAULT_ATTENTION_LAYER

    def __post_init__(self):
        check_spec_fields(self)

    embed_dim = property(lambda self: self.recursion.embed_dim, doc="The block's width C.")
    schedule = property(lambda self: self.recursion.schedule, doc="What each application does.")
    lrc = property(lambda self: self.recursion.lrc, doc="LRC on every residual.")
    nll_ratio = property(lambda self: self.recursion.nll_ratio, doc="The NLL's hidden ratio (0: none).")
    activation = property(lambda self: self.recursion.activation, doc="The FFN's and NLL's activation.")
    dropout = property(lambda self: self.recursion.dropout, doc="Dropout of every branch.")
    activation_dropout = property(lambda self: self.recursion.activation_dropout, doc="The FFN's inner dropout.")
    norm_eps = property(lambda self: self.recursion.norm_eps, doc="The LayerNorms' epsilon.")
    checkpoint = property(lambda self: self.recursion.checkpoint, doc="Recompute each application in backward.")

    def build(self) -> Recursive:
        """A freshly initialised layer: (B, T, C) -> (B, T, C)."""
        block = SReTBlock(
            embed_dim=self.embed_dim,
            num_heads=self.num_heads,
            ffn_dim=self.ffn_dim,
            schedule=self.schedule,
            causal=self.causal,
            cross_attention=self.cross_attention,
            normalize_before=self.normalize_before,
            lrc=self.lrc,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation_dropout=self.activation_dropout,
            activation=self.activation,
            drop_path=self.drop_path,
            norm_eps=self.norm_eps,
            qkv_bias=self.qkv_bias,
            out_proj_bias=True,
            normalize_stream_before_ffn=self.normalize_stream_before_ffn,
            attn_layer=attention_layer(self.attention),
        )
        return self.recursion.apply(block)


@dataclass(frozen=True)
class SideSpec:
    """One side of an encoder-decoder: ``layers`` unique layers, each built from ``layer``."""

    layer: SReTLayerSpec
    layers: int

    def __post_init__(self):
        check_spec_fields(self)

    @property
    def recursions(self) -> int:
        """The applications each layer is built (and trained) with."""
        return len(self.layer.schedule)

    @property
    def depth(self) -> int:
        """How many of them run."""
        return self.layer.schedule.depth

    def build(self) -> nn.ModuleList:
        """The side's freshly initialised layers, in order."""
        return nn.ModuleList(self.layer.build() for _ in range(self.layers))


@dataclass(frozen=True)
class EncoderDecoderSpec:
    """The layers of a translation model: the encoder's (``causal=False``, no cross-attention)
    and the decoder's."""

    encoder: SideSpec
    decoder: SideSpec

    def __post_init__(self):
        check_spec_fields(self)

    def side(self, name: str) -> SideSpec:
        """``"encoder"`` or ``"decoder"``."""
        if name not in ("encoder", "decoder"):
            raise ValueError(f"side must be 'encoder' or 'decoder', got {name!r}")
        return getattr(self, name)
