"""What one recursive SReT layer of a translation model is, as one typed value.

The framework adapters (the fairseq model, the transformers model) read their own options
once into a :class:`SReTLayerSpec` per side and build every unique layer from it: options
-> spec -> modules, one direction. The spec holds the trained schedule at the depth that
runs; the modules built from it keep that schedule in one place, their
:class:`~fairseq_sret.core.Recursive` (which :func:`~fairseq_sret.core.set_depth` changes).
"""

from dataclasses import dataclass

from .block import SReTBlock
from .feedforward import NonLinearProjection
from .recursion import Recursive
from .schedule import RecursionSchedule


@dataclass(frozen=True)
class SReTLayerSpec:
    """One side's unique layer: a shared :class:`SReTBlock` (self-attention [+
    cross-attention] + FFN, LRC on every residual, paper Eq. 1, 7-8) applied
    ``len(schedule)`` times, an NLL of hidden ratio ``nll_ratio`` after every application
    (Eq. 6; 0: none).

    ``activation_dropout`` is the FFN's inner dropout; ``checkpoint``: recompute each
    application in the backward pass (memory grows with unique layers, not depth).
    """

    embed_dim: int
    num_heads: int
    ffn_dim: int
    schedule: RecursionSchedule
    causal: bool = False
    cross_attention: bool = False
    normalize_before: bool = True
    lrc: bool = True
    nll_ratio: float = 1.0
    activation: str = "relu"
    dropout: float = 0.0
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    checkpoint: bool = False

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
        )
        make_nll = None
        if self.nll_ratio > 0:
            def make_nll(_index: int) -> NonLinearProjection:
                return NonLinearProjection(
                    self.embed_dim, self.nll_ratio, lrc=self.lrc, activation=self.activation,
                    dropout=self.dropout, activation_dropout=self.activation_dropout,
                )
        return Recursive(block, self.schedule, make_nll, checkpoint=self.checkpoint)
