"""The one training loop of the vision commands: the updates of an epoch, and the epochs.

:class:`Trainer` runs one epoch of updates: the batch is prepared (``prepare``: e.g. the
normalisation, random erasing and Mixup of timm's recipe), its loss taken (an
:class:`~fairseq_sret_cli.vision_trainer.objectives.Objective`: cross-entropy or distillation,
mixed depth), checked to be finite, back-propagated (through a gradient scaler: mixed
precision), clipped, and the optimizer, the scheduler (timm's ``step_update`` interface: the
learning rate of the next update is set after each) and the weights' EMA step. :func:`fit`
runs the epochs, each validated and checked (:func:`check_finite`) before the recipe records
and saves it.
"""

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Optional

import torch
from torch import Tensor, nn


class Diverged(FloatingPointError):
    """A loss or a weight that is not finite: training diverged."""


def check_finite(model: nn.Module, stats: Dict[str, float], where: str) -> None:
    """:class:`Diverged` when ``model`` holds a weight that is NaN or infinite, or a loss in
    ``stats`` is: a diverged model, whose accuracy (of NaN logits) would read as a result."""
    bad = next((name for name, p in model.named_parameters() if not torch.isfinite(p).all()), None)
    if bad is not None:
        raise Diverged(f"the weight {bad} is not finite after {where}")
    losses = {k: v for k, v in stats.items() if "loss" in k and isinstance(v, float) and not math.isfinite(v)}
    if losses:
        raise Diverged(f"{', '.join(f'{k} is {v}' for k, v in losses.items())} after {where}")


@dataclass
class EpochTotals:
    """What an epoch of updates adds up: each logged loss times its batch's images (``sums``;
    ``loss`` is the minimised one), the images seen, the learning rate of the last update
    (``lr_last``) and the one the optimizer holds after the epoch (``lr_next``: the next
    update's), and the epoch's processor and wall seconds (set by :func:`fit`)."""

    sums: Dict[str, float] = field(default_factory=dict)
    seen: int = 0
    lr_last: float = float("nan")
    lr_next: float = float("nan")
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0


class Trainer:
    """One epoch of updates of ``model`` (see the module's docstring).

    ``objective(x, target, index)`` returns the losses to log by name, ``"loss"`` the one
    minimised; ``prepare(batch)`` turns a loader's batch into ``(x, target, index)``;
    ``scheduler`` has timm's ``step_update(num_updates)``; ``ema`` timm's
    ``update(model, step=...)``; ``progress(epoch, step, loss, lr)`` is called every
    ``log_interval`` updates.
    """

    def __init__(self, model: nn.Module, optimizer, scheduler, objective: Callable, steps_per_epoch: int, *,
                 prepare: Optional[Callable] = None, ema=None, scaler=None, clip_grad: Optional[float] = None,
                 progress: Optional[Callable] = None, log_interval: int = 0):
        self.model, self.optimizer, self.scheduler, self.objective = model, optimizer, scheduler, objective
        self.steps_per_epoch, self.prepare, self.ema, self.clip_grad = steps_per_epoch, prepare, ema, clip_grad
        self.scaler = scaler if scaler is not None else torch.amp.GradScaler("cpu", enabled=False)
        self.progress, self.log_interval = progress, log_interval

    def train_epoch(self, epoch: int, batches: Iterable) -> EpochTotals:
        """The updates of ``epoch`` (0-based) from ``batches``; :class:`Diverged` for a loss
        that is not finite."""
        self.model.train()
        totals = EpochTotals()
        for step, batch in enumerate(batches):
            if step >= self.steps_per_epoch:
                break
            x, target, index = self.prepare(batch) if self.prepare is not None else batch
            losses = self.objective(x, target, index)
            loss = losses["loss"]
            value = loss.item()
            if not math.isfinite(value):
                raise Diverged(f"the loss is {value} at epoch {epoch} step {step}")
            totals.lr_last = self.optimizer.param_groups[0]["lr"]
            self._update(loss, epoch * self.steps_per_epoch + step)
            for name, v in losses.items():
                totals.sums[name] = totals.sums.get(name, 0.0) + v.item() * x.size(0)
            totals.seen += x.size(0)
            if self.progress is not None and self.log_interval and step % self.log_interval == 0:
                self.progress(epoch, step, value, totals.lr_last)
        totals.lr_next = self.optimizer.param_groups[0]["lr"]
        return totals

    def _update(self, loss: Tensor, update: int) -> None:
        """Back-propagate ``loss`` and step the optimizer, the schedule and the EMA (``update``:
        the 0-based number of this update in the run)."""
        optimizer, scaler = self.optimizer, self.scaler
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if self.clip_grad:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
        scaler.step(optimizer)
        scaler.update()
        self.scheduler.step_update(update + 1)
        if self.ema is not None:
            self.ema.update(self.model, step=update)


def fit(trainer: Trainer, recipe, start_epoch: int, epochs: int) -> Optional[dict]:
    """Train epochs ``start_epoch`` .. ``epochs - 1``; returns the last epoch's statistics.

    ``recipe`` supplies each epoch's ``batches(epoch)``, turns its totals into statistics
    (``epoch_stats(epoch, totals)``), adds the validation's (``validate()``), names the epoch
    in messages (``epoch_name(epoch)``) and records and saves it (``epoch_done(epoch, stats,
    cpu_seconds, wall_start)``: the epoch's processor seconds, validation included, and the
    ``time.time()`` it started at) once :func:`check_finite` has passed it.
    """
    stats = None
    for epoch in range(start_epoch, epochs):
        cpu_start, wall_start = time.process_time(), time.time()
        totals = trainer.train_epoch(epoch, recipe.batches(epoch))
        totals.cpu_seconds, totals.wall_seconds = time.process_time() - cpu_start, time.time() - wall_start
        stats = recipe.epoch_stats(epoch, totals)
        stats.update(recipe.validate())
        check_finite(trainer.model, stats, recipe.epoch_name(epoch))
        recipe.epoch_done(epoch, stats, time.process_time() - cpu_start, wall_start)
    return stats
