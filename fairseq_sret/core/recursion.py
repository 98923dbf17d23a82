"""Recursive application of a shared layer with non-shared NLLs (paper Eq. 6)."""

from typing import Any, Callable, List, Optional, Union

import torch.utils.checkpoint
from torch import Tensor, nn

from .cache import BlockCache
from .config import is_fx_tracing
from .fused import fused_kernels_active
from .schedule import RecursionSchedule, RecursionStep, check_depth


class Recursive(nn.Module):
    """``z = NLL_N(F(... NLL_1(F(z))))``: one shared ``layer`` F applied N times.

    ``schedule`` says what each application does (:mod:`fairseq_sret.core.schedule`); it is
    kept here only, the one place that decides what runs (:func:`~fairseq_sret.core.set_depth`
    changes it). An int N takes the layer's own slicing (``layer.recursion_schedule(N)``, a
    block built with ``groups=(8, 2)``) or plain applications. The layer must accept ``recursion=<RecursionStep>`` (and
    ``cache=`` when ``caches`` is given), so every application can use its own group
    count, partition mode and incremental cache. ``make_nll(i)`` builds NLL_i (a module
    taking ``recursion=`` too, like :class:`NonLinearProjection`), applied
    where a step names it; pass None for no NLL (plain weight sharing). Parameters: those
    of ``layer`` once, plus one NLL per recursion.

    Only the applications whose step ``runs`` are applied: a layer built with N recursions
    can run its first d <= N applications and their NLLs, the others are skipped
    (:func:`fairseq_sret.core.depth.set_depth` / :func:`~fairseq_sret.core.depth.at_depth`).

    With ``checkpoint=True`` each application is recomputed in the backward pass
    (activation checkpointing), so training memory grows with one application's
    activations instead of all of them (not in a ``torch.fx`` graph, which records the
    applications themselves).
    """

    def __init__(
        self,
        layer: nn.Module,
        schedule: Union[int, RecursionSchedule],
        make_nll: Optional[Callable[[int], nn.Module]] = None,
        checkpoint: bool = False,
    ):
        super().__init__()
        if not isinstance(schedule, RecursionSchedule):
            check_depth(schedule, name="recursions")
            own = getattr(layer, "recursion_schedule", None)
            schedule = own(schedule) if callable(own) else RecursionSchedule.parse(schedule)
        self.layer = layer
        self.schedule = schedule
        self.nlls = nn.ModuleList([make_nll(s.index) for s in self.schedule]) if make_nll else None
        self.checkpoint = checkpoint

    @property
    def recursions(self) -> int:
        """Applications the layer was built with (its NLLs and caches)."""
        return len(self.schedule)

    @property
    def depth(self) -> int:
        """Applications that run."""
        return self.schedule.depth

    def new_caches(self) -> List[BlockCache]:
        """Empty incremental caches, one per application (the layer's ``new_caches`` when it
        has one: an :class:`~fairseq_sret.core.SReTBlock` shares its cross-attention cache)."""
        make = getattr(self.layer, "new_caches", None)
        return make(self.recursions) if callable(make) else [BlockCache() for _ in range(self.recursions)]

    @staticmethod
    def reorder_caches(caches: List[BlockCache], new_order: Tensor) -> None:
        """Beam-search reordering of :meth:`new_caches`' caches in place, each attention cache
        once however many applications share it (:meth:`~fairseq_sret.core.AttentionCache.reorder`)."""
        seen = set()
        for cache in caches:
            for attention_cache in cache.attention_caches():
                if id(attention_cache) not in seen:
                    seen.add(id(attention_cache))
                    attention_cache.reorder(new_order)

    def _apply_once(self, x: Tensor, step: RecursionStep, cache, args, kwargs) -> Tensor:
        if cache is not None:
            kwargs = dict(kwargs, cache=cache)
        x = self.layer(x, *args, recursion=step, **kwargs)
        if self.nlls is not None and step.nll is not None:
            x = self.nlls[step.nll](x, recursion=step)
        return x

    def forward(self, x: Tensor, *args: Any, caches: Optional[List[BlockCache]] = None, **kwargs: Any) -> Tensor:
        """x: (B, L, C) -> (B, L, C). ``caches``: one :class:`BlockCache` per recursion, or None."""
        if caches is not None and len(caches) != self.recursions:
            raise ValueError(f"expected {self.recursions} caches, got {len(caches)}")
        if self._chains_norms(x):
            return self._forward_chained(x, caches, args, kwargs)
        for step in self.schedule.running():
            cache = None if caches is None else caches[step.index]
            if self.checkpoint and self.training and cache is None and not is_fx_tracing() and x.requires_grad:
                x = torch.utils.checkpoint.checkpoint(
                    self._apply_once, x, step, None, args, kwargs, use_reentrant=False
                )
            else:
                x = self._apply_once(x, step, cache, args, kwargs)
        return x

    # ------------------------------------------------------------ fused LayerNorm chain
    def _chains_norms(self, x: Tensor) -> bool:
        """Chain the applications through the fused residual + LayerNorm kernel: only when
        that kernel runs for ``x`` (CUDA + Triton, not compiling), every module takes
        ``normed``/``next_norm`` (pre-LN blocks, NLLs) and no checkpointing is active."""
        if self.checkpoint and self.training:
            return False
        if not getattr(self.layer, "chains_norms", False):
            return False
        if self.nlls is not None and not all(getattr(n, "chains_norms", False) for n in self.nlls):
            return False
        return fused_kernels_active(x)

    def _forward_chained(self, x: Tensor, caches, args, kwargs) -> Tensor:
        """The same applications as :meth:`forward`, each module's last residual computed
        together with the next module's input LayerNorm (the next application of the layer,
        or the NLL that follows it): one kernel instead of two reads of the residual stream."""
        calls = []
        for step in self.schedule.running():
            layer_kwargs = dict(kwargs, recursion=step)
            if caches is not None and caches[step.index] is not None:
                layer_kwargs["cache"] = caches[step.index]
            calls.append((self.layer, args, layer_kwargs))
            if self.nlls is not None and step.nll is not None:
                calls.append((self.nlls[step.nll], (), {"recursion": step}))
        normed = None
        for i, (module, call_args, call_kwargs) in enumerate(calls):
            following = calls[i + 1][0].input_norm if i + 1 < len(calls) else None
            out = module(x, *call_args, normed=normed, next_norm=following, **call_kwargs)
            x, normed = out if following is not None else (out, None)
        return x

    def extra_repr(self) -> str:
        return f"schedule={self.schedule.describe()}, checkpoint={self.checkpoint}"
