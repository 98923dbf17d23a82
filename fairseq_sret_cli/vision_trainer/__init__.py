"""The vision trainer: one training loop for the image classifiers, with its recipes.

- :mod:`.loop`: :class:`~.loop.Trainer` (an epoch of updates: loss, finite check, gradient
  scaling and clipping, optimizer, timm-style scheduler, EMA) and :func:`~.loop.fit` (the
  epochs: validation, :func:`~.loop.check_finite`, the recipe's record and checkpoint).
- :mod:`.objectives`: the loss (label smoothing, Mixup's soft targets, soft distillation,
  mixed depth) and mixed-precision settings.
- :mod:`.schedules`: AdamW parameter groups and the warm-up-then-cosine schedule.
- :mod:`.evaluation`: top-k accuracy and cross-entropy, over a loader or images in memory.
- :mod:`.record`: log lines, processors and threads, random state, resume checks.
- :mod:`.run_folders`: the output rules (``--resume``, ``--force``, inputs never replaced).
- :mod:`.cifar_recipe`: images held in memory, timm's recipe (``sret-train-cifar``).
- :mod:`.folder_recipe`: an ImageFolder (ImageNet) read from disk, distillation
  (``sret-train-vision``).
"""

from .loop import Diverged, EpochTotals, Trainer, check_finite, fit
from .objectives import NO_AMP, Amp, Objective, autocast_settings

__all__ = ["Amp", "Diverged", "EpochTotals", "NO_AMP", "Objective", "Trainer", "autocast_settings", "check_finite",
           "fit"]
