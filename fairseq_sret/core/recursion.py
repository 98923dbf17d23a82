"""Recursive application of a shared layer with non-shared NLLs (paper Eq. 6)."""

from typing import Any, Callable, List, Optional

import torch.utils.checkpoint
from torch import Tensor, nn


class Recursive(nn.Module):
    """``z = NLL_N(F(... NLL_1(F(z))))``: one shared ``layer`` F applied ``recursions`` times.

    ``layer`` must accept ``recursion=<index>`` (and ``cache=`` when ``caches`` is given),
    so that every application can use its own group count, partition mode and incremental
    cache. ``make_nll(i)`` builds NLL_i; pass None for no NLL (plain weight sharing).
    Parameters: those of ``layer`` once, plus one NLL per recursion.

    With ``checkpoint=True`` each application is recomputed in the backward pass
    (activation checkpointing), so training memory grows with one application's
    activations instead of all of them.
    """

    def __init__(
        self,
        layer: nn.Module,
        recursions: int,
        make_nll: Optional[Callable[[int], nn.Module]] = None,
        checkpoint: bool = False,
    ):
        super().__init__()
        if not isinstance(recursions, int) or recursions < 1:
            raise ValueError(f"recursions must be an integer >= 1, got {recursions!r}")
        self.layer = layer
        self.recursions = recursions
        self.nlls = nn.ModuleList([make_nll(i) for i in range(recursions)]) if make_nll else None
        self.checkpoint = checkpoint

    def _apply_once(self, x: Tensor, recursion: int, cache, args, kwargs) -> Tensor:
        if cache is not None:
            kwargs = dict(kwargs, cache=cache)
        x = self.layer(x, *args, recursion=recursion, **kwargs)
        if self.nlls is not None:
            x = self.nlls[recursion](x)
        return x

    def forward(self, x: Tensor, *args: Any, caches: Optional[List[dict]] = None, **kwargs: Any) -> Tensor:
        """x: (B, L, C) -> (B, L, C). ``caches``: one dict per recursion, or None."""
        if caches is not None and len(caches) != self.recursions:
            raise ValueError(f"expected {self.recursions} caches, got {len(caches)}")
        for r in range(self.recursions):
            cache = None if caches is None else caches[r]
            if self.checkpoint and self.training and cache is None and x.requires_grad:
                x = torch.utils.checkpoint.checkpoint(
                    self._apply_once, x, r, None, args, kwargs, use_reentrant=False
                )
            else:
                x = self._apply_once(x, r, cache, args, kwargs)
        return x

    def extra_repr(self) -> str:
        return f"recursions={self.recursions}, checkpoint={self.checkpoint}"
