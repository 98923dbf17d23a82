"""The optimizer's parameter groups and the ImageFolder recipe's learning-rate schedule.

The CIFAR recipe takes both from timm (``create_optimizer_v2``, ``create_scheduler_v2``);
the ImageFolder recipe, which runs without timm installed, builds the same AdamW groups with
:func:`param_groups` and DeiT's warm-up-then-cosine schedule with :class:`WarmupCosine`,
which steps like timm's schedulers (``step_update``) so that one loop drives either.
"""

import math
from typing import Dict, List

from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> List[Dict]:
    """AdamW groups as in DeiT/timm: no weight decay on biases, norms, LRC scalars
    (every parameter with fewer than 2 dimensions) and ``model.no_weight_decay()``."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def cosine_lr(
    step: int, total_steps: int, base_lr: float, warmup_steps: int = 0, min_lr: float = 0.0,
    warmup_lr: float = 0.0,
) -> float:
    """Linear warm-up from ``warmup_lr`` to ``base_lr``, then cosine decay to ``min_lr``."""
    if step < warmup_steps:
        return warmup_lr + (base_lr - warmup_lr) * step / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


class WarmupCosine:
    """:func:`cosine_lr` per update over ``epochs * steps_per_epoch`` updates (warm-up of
    ``warmup_epochs``, which may be fractional), set on every group of ``optimizer`` by
    ``step_update(n)`` (timm's scheduler interface: the rate of update ``n``, 0-based); the
    first update's is set when it is made."""

    def __init__(self, optimizer, *, epochs: int, steps_per_epoch: int, lr: float, min_lr: float, warmup_lr: float,
                 warmup_epochs: float):
        self.optimizer, self.lr, self.min_lr, self.warmup_lr = optimizer, lr, min_lr, warmup_lr
        self.total_steps = epochs * steps_per_epoch
        self.warmup_steps = int(round(warmup_epochs * steps_per_epoch))
        self.step_update(0)

    def step_update(self, num_updates: int) -> None:
        lr = cosine_lr(num_updates, self.total_steps, self.lr, self.warmup_steps, self.min_lr, self.warmup_lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
