"""The ``load_error_cause`` patch: ``Trainer.load_checkpoint`` turns every error of loading the
weights into ``Cannot load model parameters from checkpoint ...; please ensure that the
architectures match``, so the last line of a refused resume or fine-tuning (another
dictionary, another size) hides why. Patched: the last line is the cause's, with the file.
"""

import functools
import logging
import tempfile

from fairseq import trainer as trainer_module

from .common import probe_checkpoint


class CheckpointLoadError(RuntimeError):
    """The weights of a checkpoint could not be loaded into the model; the message says why."""


def _with_the_cause(load_checkpoint):
    @functools.wraps(load_checkpoint)
    def wrapper(self, filename, *args, **kwargs):
        try:
            return load_checkpoint(self, filename, *args, **kwargs)
        except Exception as exc:
            cause = exc.__context__
            if type(exc) is not Exception or cause is None or "architectures match" not in str(exc):
                raise
            raise CheckpointLoadError(f"cannot load the model parameters of {filename}: {cause}") from cause

    wrapper.sret_patch = "load_error_cause"
    return wrapper


def load_errors_hide_their_cause(load_checkpoint=None) -> bool:
    """Does ``Trainer.load_checkpoint`` end with a message that leaves out why the model's
    ``load_state_dict`` failed? Calls it with a stand-in trainer whose model refuses the weights."""
    from types import SimpleNamespace

    load_checkpoint = load_checkpoint or trainer_module.Trainer.load_checkpoint

    class Model:
        args = None

        def set_num_updates(self, num_updates):
            pass

        def load_state_dict(self, *args, **kwargs):
            raise ValueError("sret probe: the weights do not fit")

    cfg = SimpleNamespace(checkpoint=SimpleNamespace(load_checkpoint_on_all_dp_ranks=False),
                          distributed_training=SimpleNamespace(use_sharded_state=False, zero_sharding="none"),
                          model=SimpleNamespace())
    stand_in = SimpleNamespace(data_parallel_world_size=1, data_parallel_rank=0, tpu=False, is_fsdp=False, cfg=cfg,
                               model=Model(), get_criterion=lambda: None)
    quiet = logging.getLogger("fairseq.trainer")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # not "Preparing to load checkpoint probe.pt" in every training log
    with tempfile.TemporaryDirectory() as folder:
        path = probe_checkpoint(folder)
        try:
            load_checkpoint(stand_in, path)
        except Exception as exc:
            return "sret probe" not in str(exc)
        finally:
            quiet.setLevel(level)
    return True


def install(patch) -> None:
    patch.replace(trainer_module.Trainer, "load_checkpoint", _with_the_cause(trainer_module.Trainer.load_checkpoint))
