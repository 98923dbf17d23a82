"""Mixed-depth training for sret_transformer (``--criterion
sret_mixed_depth_label_smoothed_cross_entropy --mixed-depth 1:0.5``).

The paper's explicit mixed-depth training ("Landscape Visualizations of DeiT and Our
Mixed-depth SReT"): the full-depth network and shallower networks that re-use its weights
are trained together, an explicit deep supervision. In one forward/backward the loss is

    L = LS-CE(full depth) + sum_k w_k LS-CE(depth d_k)

where a depth ``d`` runs the first ``d`` applications of every shared layer (and their
NLLs; the later NLLs are skipped, see :mod:`fairseq_sret.core.mixed_depth`). Every depth's
label-smoothed loss is logged as ``loss_depth<d>`` (``loss_depth<e>_<d>`` for an
encoder/decoder pair), the full depth's included; ``loss`` is the sum that is optimised
and ``nll_loss``/``ppl`` are the full depth's. Without ``--mixed-depth`` the criterion is
fairseq's ``label_smoothed_cross_entropy``.
"""

import math
from dataclasses import dataclass, field
from typing import Tuple

from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.logging import metrics
from torch import nn

from ..core.depth import DepthControl
from ..core.mixed_depth import DepthTerm, check_depth_options, mixed_depth_loss, parse_depth_warmup, parse_mixed_depth

PREFIX = "loss_depth"


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside fairseq's data-parallel wrappers (``.module`` chains)."""
    while not isinstance(model, DepthControl) and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


@dataclass
class MixedDepthLabelSmoothedCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig):
    mixed_depth: str = field(
        default="",
        metadata={"help": "shallower depths trained with the full depth, each DEPTH[:WEIGHT]"
                  " (weight 1 if omitted), comma-separated: '1:0.5' adds 0.5 x the loss of the"
                  " model run with one application per layer; 'ENC/DEC:W' gives the encoder and"
                  " decoder depths separately ('1/2:0.5'). Empty: plain label-smoothed CE"},
    )
    depth_warmup: str = field(
        default="",
        metadata={"help": "DEPTH:UPDATES: the first UPDATES updates train only the model run at"
                  " DEPTH (fewer layer applications, so cheaper updates), then the full depth"
                  " (and the --mixed-depth terms); 'ENC/DEC:UPDATES' per side. Validation is"
                  " always at the full depth. Empty: none"},
    )


@register_criterion(
    "sret_mixed_depth_label_smoothed_cross_entropy", dataclass=MixedDepthLabelSmoothedCrossEntropyConfig
)
class MixedDepthLabelSmoothedCrossEntropy(LabelSmoothedCrossEntropyCriterion):
    """fairseq's label-smoothed cross-entropy of the full-depth output plus the weighted
    losses of shallower outputs of the same weights (``--mixed-depth``)."""

    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 mixed_depth="", depth_warmup=""):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.mixed_depth, self.depth_warmup = mixed_depth, depth_warmup
        self.terms: Tuple[DepthTerm, ...] = parse_mixed_depth(mixed_depth, sides=2)
        self.warmup = parse_depth_warmup(depth_warmup, sides=2)
        self._checked = None

    def check_model(self, model) -> Tuple[int, int]:
        """The model's (encoder, decoder) recursions, after checking every term fits them."""
        if not isinstance(model, DepthControl) or len(model.depth_sides) != 2:
            raise ValueError(f"--mixed-depth needs an sret_transformer model, got {type(model).__name__}")
        full = model.recursions
        if self._checked != full:
            check_depth_options(self.mixed_depth, self.depth_warmup, full)
            self._checked = full
        return full

    def forward(self, model, sample, reduce=True):
        if not self.terms and self.warmup is None:
            return super().forward(model, sample, reduce=reduce)
        inner = unwrap(model)
        self.check_model(inner)
        # the trainer tells the model its update count before each training step
        if self.warmup is not None and model.training and self.warmup.active(getattr(inner, "num_updates", 0)):
            with inner.at_depth(*self.warmup.depths):
                return super().forward(model, sample, reduce=reduce)
        if not self.terms:
            return super().forward(model, sample, reduce=reduce)
        with inner.at_depth():  # the full depth, through the (data-parallel) wrapper
            loss, sample_size, logging_output = super().forward(model, sample, reduce=reduce)

        def shallow_loss():
            # The shallower passes call the unwrapped model: a data-parallel wrapper takes
            # one forward per backward, and the full-depth pass already used every
            # parameter, so the summed gradients are reduced once, as usual.
            return self.compute_loss(inner, inner(**sample["net_input"]), sample, reduce=reduce)[0]

        total, losses = mixed_depth_loss(inner, self.terms, loss, shallow_loss)
        logging_output.update({f"{PREFIX}{label}": value.data for label, value in losses.items()})
        logging_output["loss"] = total.data
        return total, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        keys = sorted({key for log in logging_outputs for key in log if key.startswith(PREFIX)})
        for key in keys:
            value = sum(log.get(key, 0) for log in logging_outputs)
            metrics.log_scalar(key, value / sample_size / math.log(2), sample_size, round=3)
