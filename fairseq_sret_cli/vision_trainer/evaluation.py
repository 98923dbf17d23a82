"""Scoring a vision model: top-k accuracy and cross-entropy, over a loader (the ImageFolder
recipe) or over images held in memory (the CIFAR recipe), at every depth of a recursive model."""

from typing import Dict, List, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq_sret.core.depth import DepthControl
from .objectives import NO_AMP, Amp


@torch.no_grad()
def topk_correct(logits: Tensor, target: Tensor, ks: Sequence[int] = (1, 5)) -> List[int]:
    """Number of samples whose target is among the top-k logits, for each k."""
    k_max = min(max(ks), logits.size(1))
    top = logits.topk(k_max, dim=1).indices
    hit = top == target[:, None]
    return [int(hit[:, : min(k, k_max)].any(dim=1).sum()) for k in ks]


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, amp: Amp = NO_AMP) -> Dict[str, float]:
    """Cross-entropy and top-1/top-5 accuracy (%) of ``model`` over ``loader``'s (images, target)."""
    enabled, dtype, _ = amp
    model.eval()
    total, loss_sum, top1, top5 = 0, 0.0, 0, 0
    for images, target in loader:
        images, target = images.to(device, non_blocking=True), target.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=enabled):
            logits = model(images)
        loss_sum += F.cross_entropy(logits.float(), target, reduction="sum").item()
        c1, c5 = topk_correct(logits, target, (1, 5))
        top1, top5, total = top1 + c1, top5 + c5, total + target.numel()
    return {"loss": loss_sum / total, "acc1": 100.0 * top1 / total, "acc5": 100.0 * top5 / total, "n": total}


def normalise(images: Tensor, mean, std) -> Tensor:
    """uint8 (B, 3, H, W) -> float, (x / 255 - mean) / std."""
    mean_t = torch.tensor(mean).view(1, 3, 1, 1) * 255
    std_t = torch.tensor(std).view(1, 3, 1, 1) * 255
    return (images.float() - mean_t) / std_t


@torch.no_grad()
def evaluate_images(model: nn.Module, data, mean, std, batch_size: int) -> Dict[str, float]:
    """Top-1 accuracy (%) and cross-entropy of ``model`` on ``data`` (an
    :class:`~fairseq_sret_cli.image_tensors.ImageTensors`: uint8 images held in memory)."""
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(data), batch_size):
        images = normalise(data.images[start:start + batch_size].permute(0, 3, 1, 2), mean, std)
        target = data.targets[start:start + batch_size]
        logits = model(images)
        loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
        correct += int((logits.argmax(1) == target).sum())
    return {"acc1": 100.0 * correct / len(data), "loss": loss_sum / len(data)}


def evaluate_depths(model: nn.Module, data, mean, std, batch_size: int) -> Dict[str, dict]:
    """:func:`evaluate_images` at every depth of a recursive model (``{"depth2": ...,
    "depth1": ...}``), or ``{"": ...}``."""
    if not isinstance(model, DepthControl):
        return {"": evaluate_images(model, data, mean, std, batch_size)}
    results = {}
    for depth in range(model.recursions, 0, -1):
        with model.at_depth(depth):
            results[f"depth{depth}"] = evaluate_images(model, data, mean, std, batch_size)
    return results
