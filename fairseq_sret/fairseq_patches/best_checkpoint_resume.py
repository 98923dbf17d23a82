"""The ``best_checkpoint_resume`` patch: ``save_checkpoint`` writes ``checkpoint_best.pt`` before
``checkpoint_last.pt``, and a resumed run takes the best validation score to beat from
``checkpoint_last.pt``; a run killed between the two writes forgets its newest best, and the
first validation after the resume that beats the older score replaces the better
``checkpoint_best.pt``. Patched: on resuming from ``checkpoint_last.pt``, the score stored in
``checkpoint_best.pt`` is the one to beat when it is better.
"""

import functools
import logging
import os
import tempfile
from typing import Optional

import torch
from fairseq import checkpoint_utils

from ..checkpoints import load_checkpoint as read_checkpoint
from .patience_resume import patience_state, set_patience_state

logger = logging.getLogger(__name__)


def _best_checkpoint_score(cfg, trainer) -> Optional[float]:
    """The validation score ``checkpoint_best.pt`` of the run holds, None where there is none
    (or it cannot be read: fairseq then goes on with checkpoint_last.pt's, as it always did)."""
    path = os.path.join(cfg.save_dir, f"checkpoint_best{trainer.checkpoint_suffix}.pt")
    if not os.path.isfile(path):
        return None
    try:
        state = read_checkpoint(path, mmap=True)
    except Exception as exc:  # a damaged best checkpoint must not stop the resume
        logger.warning("could not read the best validation score of %s (%s)", path, exc)
        return None
    extra_state = state.get("extra_state") or {}
    best = extra_state.get("best", extra_state.get("val_loss"))
    return None if best is None else float(best)


def _load_keeping_the_best(load_checkpoint):
    @functools.wraps(load_checkpoint)
    def wrapper(cfg, trainer, **passthrough_args):
        extra_state, epoch_itr = load_checkpoint(cfg, trainer, **passthrough_args)
        if (extra_state is None or cfg.reset_optimizer or cfg.reset_meters
                or cfg.restore_file != "checkpoint_last.pt"):  # fairseq's own rule for keeping the best score
            return extra_state, epoch_itr
        on_disk = _best_checkpoint_score(cfg, trainer)
        saved = getattr(checkpoint_utils.save_checkpoint, "best", None)
        better = max if cfg.maximize_best_checkpoint_metric else min
        if on_disk is not None and (saved is None or better(on_disk, saved) != saved):
            logger.info("checkpoint_best%s.pt holds a better validation score (%s) than checkpoint_last%s.pt"
                        " records (%s: the run was stopped between writing the two); it stays the best to beat",
                        trainer.checkpoint_suffix, on_disk, trainer.checkpoint_suffix, saved)
            checkpoint_utils.save_checkpoint.best = on_disk
        return extra_state, epoch_itr

    wrapper.sret_patch = "best_checkpoint_resume"
    return wrapper


def best_checkpoint_forgotten_on_resume(load_checkpoint=None) -> bool:
    """After a kill between the writing of ``checkpoint_best.pt`` and of ``checkpoint_last.pt``,
    does a resumed run let a worse validation score replace the best checkpoint?

    Writes a ``checkpoint_best.pt`` holding the score 0.5, resumes through ``load_checkpoint``
    with a stand-in trainer whose ``checkpoint_last.pt`` records 0.9 (the best before), and reads
    the score that fairseq's ``save_checkpoint`` will compare the next validation with: 0.9
    lets a 0.7 replace the better checkpoint. fairseq's own state is restored afterwards.
    """
    from types import SimpleNamespace

    load_checkpoint = load_checkpoint or checkpoint_utils.load_checkpoint
    target = checkpoint_utils.save_checkpoint
    had_best, best_before = hasattr(target, "best"), getattr(target, "best", None)
    patience_before = patience_state()
    quiet = logging.getLogger("fairseq_sret.fairseq_patches")
    level = quiet.level
    quiet.setLevel(logging.WARNING)

    class Epochs:
        epoch = 2

        def load_state_dict(self, state):
            pass

    try:
        with tempfile.TemporaryDirectory() as folder:
            torch.save({"extra_state": {"best": 0.5, "val_loss": 0.5}}, os.path.join(folder, "checkpoint_best.pt"))
            cfg = SimpleNamespace(
                save_dir=folder, restore_file="checkpoint_last.pt", reset_optimizer=False, reset_lr_scheduler=False,
                reset_meters=False, reset_dataloader=False, optimizer_overrides="{}", finetune_from_model=None,
                continue_once=None, maximize_best_checkpoint_metric=False, patience=-1)
            trainer = SimpleNamespace(
                checkpoint_suffix="", data_parallel_rank=0, task=SimpleNamespace(),
                load_checkpoint=lambda *args, **kwargs: {"best": 0.9, "val_loss": 0.9, "train_iterator": {"epoch": 2}},
                get_train_iterator=lambda **kwargs: Epochs(), lr_step=lambda epoch: None)
            load_checkpoint(cfg, trainer)
            return getattr(checkpoint_utils.save_checkpoint, "best", None) != 0.5
    finally:
        quiet.setLevel(level)
        if had_best:
            target.best = best_before
        elif hasattr(target, "best"):
            del target.best
        set_patience_state(*(patience_before["best"], patience_before["num_runs"]) if patience_before else (None, 0))


def install(patch) -> None:
    patch.replace(checkpoint_utils, "load_checkpoint", _load_keeping_the_best(checkpoint_utils.load_checkpoint))
