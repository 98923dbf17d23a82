"""The ``finished_run`` patch: ``fairseq_cli.train.train`` checks ``--max-update`` and
``--stop-time-hours`` only after a training step, so ``fairseq-train`` on a run whose
``checkpoint_last.pt`` already reached them makes one more update and overwrites the
checkpoint. Patched: an epoch that would start at or past either limit does not start.
"""

from typing import Optional

from .common import training_modules, no_epoch_when


def past_the_limits(cfg, trainer) -> bool:
    """Has the run already made ``--max-update`` updates or trained ``--stop-time-hours``?"""
    max_update = cfg.optimization.max_update or float("inf")
    hours = cfg.optimization.stop_time_hours or 0
    return trainer.get_num_updates() >= max_update or (
        hours > 0 and trainer.cumulative_training_time() / 3600 > hours)


def _limits_reached(cfg, trainer) -> Optional[str]:
    if past_the_limits(cfg, trainer):
        return f"the run already reached --max-update or --stop-time-hours ({trainer.get_num_updates()} updates)"
    return None


def _stop_before_the_epoch(train_epoch):
    train = no_epoch_when(train_epoch, _limits_reached)
    train._sret_patched = True
    return train


class _EpochStarted(Exception):
    pass


def finished_run_trains_again(train_epoch=None) -> bool:
    """Does ``fairseq_cli.train.train`` start an epoch for a run already at ``--max-update``?

    Calls it with stand-ins: a trainer at 10 updates, ``max_update`` 10, and an epoch
    iterator that raises when the epoch starts.
    """
    from types import SimpleNamespace

    if train_epoch is None:
        train_epoch = training_modules()[0].train
    if getattr(train_epoch, "_sret_patched", False):
        return False

    class Epochs:
        epoch = next_epoch_idx = 1

        def next_epoch_itr(self, **kwargs):
            raise _EpochStarted()

    cfg = SimpleNamespace(
        optimization=SimpleNamespace(max_update=10, stop_time_hours=0, update_freq=[1], skip_remainder_batch=False),
        distributed_training=SimpleNamespace(fix_batches_to_gpus=False), dataset=SimpleNamespace(curriculum=0))
    trainer = SimpleNamespace(get_num_updates=lambda: 10, cumulative_training_time=lambda: 0.0)
    try:
        train_epoch(cfg, trainer, None, Epochs())
    except _EpochStarted:
        return True
    except Exception:  # a fairseq that reads more of the config first: cannot tell, so patch
        return True
    return False


def install(patch) -> None:
    for module in training_modules():
        patch.replace(module, "train", _stop_before_the_epoch(module.train))
