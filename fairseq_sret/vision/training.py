"""Training helpers for the vision models (used by sret-train-vision)."""

import math
from typing import Dict, List, Sequence

import torch
from torch import Tensor, nn


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


@torch.no_grad()
def topk_correct(logits: Tensor, target: Tensor, ks: Sequence[int] = (1, 5)) -> List[int]:
    """Number of samples whose target is among the top-k logits, for each k."""
    k_max = min(max(ks), logits.size(1))
    top = logits.topk(k_max, dim=1).indices
    hit = top == target[:, None]
    return [int(hit[:, : min(k, k_max)].any(dim=1).sum()) for k in ks]
