"""The ``patience_resume`` patch: ``fairseq_cli.train.should_stop_early`` keeps ``--patience``'s
best score and count in function attributes, not in the checkpoint: after a resume the first
validation becomes the best and counting starts again, and a run that stopped early trains on
when started again. Patched: both are saved in the checkpoint's ``extra_state`` and restored
on loading (from a checkpoint without them: the best score, counting from 0), and a run whose
count already reached ``--patience`` starts no epoch.
"""

import functools
import logging
import tempfile
from typing import Optional

from fairseq import checkpoint_utils

from .common import training_modules, no_epoch_when

logger = logging.getLogger(__name__)


#: the key of ``--patience``'s state in a checkpoint's ``extra_state``
PATIENCE_STATE = "patience"


def _early_stop_functions():
    """``should_stop_early`` of every training module: its ``best`` and ``num_runs`` attributes are
    ``--patience``'s whole state."""
    return [module.should_stop_early for module in training_modules()]


def patience_state() -> Optional[dict]:
    """``{"best": ..., "num_runs": ...}`` of ``--patience``, or None before the first validation."""
    for function in reversed(_early_stop_functions()):  # ``__main__``'s first: the one that ran
        if getattr(function, "best", None) is not None:
            return {"best": function.best, "num_runs": getattr(function, "num_runs", 0)}
    return None


def set_patience_state(best, num_runs: int) -> None:
    for function in _early_stop_functions():
        function.best, function.num_runs = best, num_runs


def _save_with_patience(save_checkpoint):
    @functools.wraps(save_checkpoint)
    def wrapper(cfg, trainer, epoch_itr, val_loss):
        state = patience_state()
        if state is None:
            return save_checkpoint(cfg, trainer, epoch_itr, val_loss)
        save_file, own = trainer.save_checkpoint, "save_checkpoint" in vars(trainer)

        def save_with_patience(filename, extra_state):
            return save_file(filename, {**extra_state, PATIENCE_STATE: state})

        trainer.save_checkpoint = save_with_patience  # fairseq builds extra_state inside save_checkpoint
        try:
            return save_checkpoint(cfg, trainer, epoch_itr, val_loss)
        finally:
            if own:
                trainer.save_checkpoint = save_file
            else:
                del trainer.save_checkpoint  # the class's method again

    wrapper.sret_patch = "patience_resume"
    return wrapper


def _load_with_patience(load_checkpoint):
    @functools.wraps(load_checkpoint)
    def wrapper(cfg, trainer, **passthrough_args):
        extra_state, epoch_itr = load_checkpoint(cfg, trainer, **passthrough_args)
        # fairseq's own rule for the best validation score: kept unless the optimizer or meters are reset
        if extra_state is None or cfg.reset_optimizer or cfg.reset_meters:
            return extra_state, epoch_itr
        saved = extra_state.get(PATIENCE_STATE)
        if saved is not None:
            set_patience_state(saved["best"], saved["num_runs"])
        elif extra_state.get("best") is not None:
            set_patience_state(extra_state["best"], 0)
            if getattr(cfg, "patience", 0) > 0:
                logger.info("the checkpoint holds no --patience count (saved without fairseq_sret):"
                            " counting again from 0 against its best validation score %s", extra_state["best"])
        return extra_state, epoch_itr

    wrapper.sret_patch = "patience_resume"
    return wrapper


def patience_lost_on_resume(save_checkpoint=None, load_checkpoint=None) -> bool:
    """Does ``--patience`` forget its count when a run resumes from its checkpoint?

    Saves a checkpoint through ``save_checkpoint`` with stand-ins (a trainer that keeps the
    ``extra_state`` it is given instead of writing a file) after 3 validations without
    improvement, forgets the count as a new process would, loads the kept state through
    ``load_checkpoint``, and reads the count. fairseq's own state is restored afterwards.
    """
    from types import SimpleNamespace

    save_checkpoint = save_checkpoint or checkpoint_utils.save_checkpoint
    load_checkpoint = load_checkpoint or checkpoint_utils.load_checkpoint
    before = patience_state()
    had_best = hasattr(checkpoint_utils.save_checkpoint, "best")
    best_before = getattr(checkpoint_utils.save_checkpoint, "best", None)
    quiet = logging.getLogger("fairseq.checkpoint_utils")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # not "Preparing to save checkpoint" in every training log
    kept = {}

    class Kept(Exception):
        pass

    def keep(filename, extra_state):
        kept.update(extra_state)
        raise Kept()  # stop before fairseq copies or cleans up files

    class Epochs:
        epoch = 1

        def end_of_epoch(self):
            return True

        def state_dict(self):
            return {"epoch": 1}

        def load_state_dict(self, state):
            pass

    try:
        with tempfile.TemporaryDirectory() as folder:
            cfg = SimpleNamespace(
                save_dir=folder, no_save=False, maximize_best_checkpoint_metric=False, no_epoch_checkpoints=True,
                save_interval=1, save_interval_updates=0, keep_best_checkpoints=0, no_last_checkpoints=False,
                write_checkpoints_asynchronously=False, reset_optimizer=False, reset_lr_scheduler=False,
                optimizer_overrides="{}", reset_meters=False, reset_dataloader=False, finetune_from_model=None,
                restore_file="checkpoint_last.pt", continue_once=None, patience=10)
            trainer = SimpleNamespace(
                data_parallel_rank=0, consolidate_optimizer=lambda: None, should_save_checkpoint_on_current_rank=True,
                get_num_updates=lambda: 10, checkpoint_suffix="", task=SimpleNamespace(), save_checkpoint=keep,
                load_checkpoint=lambda *args, **kwargs: dict(kept), get_train_iterator=lambda **kwargs: Epochs(),
                lr_step=lambda epoch: None)
            set_patience_state(0.5, 3)
            try:
                save_checkpoint(cfg, trainer, Epochs(), 0.75)
            except Kept:
                pass
            set_patience_state(None, 0)  # a new process
            load_checkpoint(cfg, trainer)
            after = patience_state()
            return after is None or after["num_runs"] != 3
    finally:
        quiet.setLevel(level)
        set_patience_state(*(before["best"], before["num_runs"]) if before else (None, 0))
        if had_best:
            checkpoint_utils.save_checkpoint.best = best_before
        elif hasattr(checkpoint_utils.save_checkpoint, "best"):
            del checkpoint_utils.save_checkpoint.best


def _stopped_early(cfg, trainer) -> Optional[str]:
    """Has the run already gone ``--patience`` validations without improving?"""
    state, patience = patience_state(), cfg.checkpoint.patience
    if patience > 0 and state is not None and state["num_runs"] >= patience:
        return f"the run already stopped early (no improvement in --patience {patience} validations)"
    return None


def install(patch) -> None:
    patch.replace(checkpoint_utils, "save_checkpoint", _save_with_patience(checkpoint_utils.save_checkpoint))
    patch.replace(checkpoint_utils, "load_checkpoint", _load_with_patience(checkpoint_utils.load_checkpoint))
    for module in training_modules():
        patch.replace(module, "train", no_epoch_when(module.train, _stopped_early))
