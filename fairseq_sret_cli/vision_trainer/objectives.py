"""The loss a vision training minimises, and the mixed precision it runs in.

One :class:`Objective` for every recipe: label-smoothed cross-entropy on class indices,
soft-target cross-entropy on the class distributions Mixup/CutMix make, or the paper's soft
distillation (no one-hot label) from a teacher model or its pre-computed logits; with
``depth_terms`` the loss of shallower depths of the same weights is added (mixed depth,
:func:`fairseq_sret.core.mixed_depth.mixed_depth_loss`).
"""

from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq_sret.core.mixed_depth import DepthTerm, mixed_depth_loss
from fairseq_sret.vision.losses import soft_distillation_loss

#: (autocast enabled, autocast dtype, use a gradient scaler), from :func:`autocast_settings`
Amp = Tuple[bool, Optional[torch.dtype], bool]
NO_AMP: Amp = (False, None, False)


def autocast_settings(device: torch.device, mode: str) -> Amp:
    """(enabled, dtype, use_grad_scaler) for torch.autocast on this device; ``mode`` is
    ``auto`` (on for CUDA), ``on`` or ``off``."""
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return NO_AMP
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return True, torch.bfloat16, False
        return True, torch.float16, True
    return True, torch.bfloat16, False  # CPU autocast supports bf16


class Objective:
    """``objective(x, target, index)`` -> the losses of a batch by name: ``loss`` (minimised;
    with mixed depth the weighted sum) and, with ``depth_terms``, ``loss_depth<label>`` for
    every depth (the full one included).

    ``net``: the module that runs (e.g. compiled; default ``model``, which holds the depth
    control). ``soft_target_loss``: ``target`` holds class distributions (Mixup/CutMix) and
    this (timm's ``SoftTargetCrossEntropy``) compares them with the logits.
    ``teacher`` / ``teacher_logits`` (rows in dataset order, looked up by ``index``): soft
    distillation at ``temperature`` instead of the label.
    """

    def __init__(self, model: nn.Module, net: Optional[nn.Module] = None, *, smoothing: float = 0.0,
                 soft_target_loss: Optional[Callable[[Tensor, Tensor], Tensor]] = None,
                 teacher: Optional[nn.Module] = None, teacher_logits: Optional[Tensor] = None, temperature: float = 1.0,
                 depth_terms: Sequence[DepthTerm] = (), device: torch.device = torch.device("cpu"),
                 amp: Amp = NO_AMP):
        self.model, self.net = model, model if net is None else net
        self.smoothing, self.soft_target_loss, self.temperature = smoothing, soft_target_loss, temperature
        self.teacher, self.teacher_logits, self.depth_terms = teacher, teacher_logits, depth_terms
        self.distill = teacher is not None or teacher_logits is not None
        self.device, self.amp = device, amp

    def criterion(self, logits: Tensor, target: Tensor, soft: Optional[Tensor]) -> Tensor:
        if self.distill:  # the paper's soft distillation: no one-hot label
            return soft_distillation_loss(logits, soft, self.temperature)
        if self.soft_target_loss is not None:
            return self.soft_target_loss(logits, target)
        return F.cross_entropy(logits.float(), target, label_smoothing=self.smoothing)

    def __call__(self, x: Tensor, target: Tensor, index: Optional[Tensor] = None) -> Dict[str, Tensor]:
        enabled, dtype, _ = self.amp
        soft = None
        with torch.autocast(self.device.type, dtype=dtype, enabled=enabled):
            logits = self.net(x)
            if self.teacher is not None:
                with torch.no_grad():
                    soft = self.teacher(x)
            elif self.teacher_logits is not None:
                soft = self.teacher_logits[index].to(self.device)
        loss = self.criterion(logits, target, soft)
        if not self.depth_terms:
            return {"loss": loss}

        def shallow_loss():  # the same weights and head, fewer applications
            with torch.autocast(self.device.type, dtype=dtype, enabled=enabled):
                return self.criterion(self.net(x), target, soft)

        total, depth_losses = mixed_depth_loss(self.model, self.depth_terms, loss, shallow_loss)
        return {"loss": total, **{f"loss_depth{label}": value for label, value in depth_losses.items()}}
