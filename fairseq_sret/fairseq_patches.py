"""Every change fairseq-sret makes to fairseq's behaviour, in one place.

:func:`apply_patches` runs when ``fairseq_sret.models`` is imported (``--user-dir
fairseq_sret`` does that). Each :class:`Patch` names the upstream defect it works around
and has a probe that shows the defect on the installed fairseq; a patch whose probe finds
fairseq already behaving is skipped. :data:`APPLIED` records what was done, and one log line
says it (``fairseq_sret.fairseq_patches`` logger, level INFO).

``SRET_FAIRSEQ_PATCHES`` in the environment chooses what may be applied: unset or ``all``
(each patch its probe asks for), ``none``, or names to leave out, each with a ``-``
(``-cpu_ddp,-keep_last_batch``). docs/fairseq_patches.md is the table of the patches: what
each fixes, the upstream report, and when its probe applies it.

The patches:

- ``keep_last_batch``: ``fairseq.data.data_utils.batch_by_size`` drops the last batch
  whenever its size is not a multiple of ``--required-batch-size-multiple`` (default 8), so
  ``fairseq-generate`` silently skips up to a batch of test sentences and BLEU is computed
  on a subset. Patched: the dropped examples come back as a final batch, with a warning once.
- ``checkpoint_loading``: ``fairseq.checkpoint_utils.load_checkpoint_to_cpu`` calls
  ``torch.load`` with torch's default ``weights_only=True`` (torch >= 2.6), which refuses
  the ``argparse.Namespace`` every fairseq checkpoint holds; and on a damaged or unsafe file
  it surfaces torch's unpickling error, which names neither the file nor the cause. Patched:
  the load runs under :func:`fairseq_sret.nmt_checkpoints.allowed_checkpoint_globals` (the one
  allow-list policy), and failures raise ``CorruptCheckpointError`` or
  ``UnsafeCheckpointError`` naming the file.
- ``cpu_ddp``: ``DistributedFairseqModel`` always passes ``device_ids=[device_id]`` to
  ``torch.nn.parallel.DistributedDataParallel``, which refuses CPU modules, so
  ``fairseq-train --cpu --distributed-world-size 2`` fails before its first update for every
  model. Patched: DDP gets ``device_ids=None`` for a module on the CPU; GPU runs are
  unchanged. (On CPUs start one process per rank with ``--distributed-no-spawn
  --distributed-init-method tcp://HOST:PORT --distributed-rank R --distributed-backend
  gloo``: fairseq's spawning launcher counts CUDA devices.)
- ``finished_run``: ``fairseq_cli.train.train`` checks ``--max-update`` and
  ``--stop-time-hours`` only after a training step, so ``fairseq-train`` on a run whose
  ``checkpoint_last.pt`` already reached them makes one more update and overwrites the
  checkpoint. Patched: an epoch that would start at or past either limit does not start.
- ``patience_resume``: ``fairseq_cli.train.should_stop_early`` keeps ``--patience``'s best
  score and count in function attributes, not in the checkpoint: after a resume the first
  validation becomes the best and counting starts again, and a run that stopped early trains
  on when started again. Patched: both are saved in the checkpoint's ``extra_state`` and
  restored on loading (from a checkpoint without them: the best score, counting from 0), and
  a run whose count already reached ``--patience`` starts no epoch.
- ``best_checkpoint_resume``: ``save_checkpoint`` writes ``checkpoint_best.pt`` before
  ``checkpoint_last.pt``, and a resumed run takes the best validation score to beat from
  ``checkpoint_last.pt``; a run killed between the two writes forgets its newest best, and the
  first validation after the resume that beats the older score replaces the better
  ``checkpoint_best.pt``. Patched: on resuming from ``checkpoint_last.pt``, the score stored in
  ``checkpoint_best.pt`` is the one to beat when it is better.
- ``cpu_bf16_inference``: ``fairseq-generate``, ``fairseq-interactive`` and the hub
  interface accept ``--bf16`` and ignore it (they honour only ``--fp16``). Patched: with
  ``--bf16`` on the CPU, ``prepare_for_inference_`` casts the model to bf16, as fairseq's
  generation does with ``model.half()`` for ``--fp16`` (fairseq's search still scores in
  fp32). Autocast with fp32 weights is slower: it casts every LayerNorm and residual output
  back to bf16 before the next linear.
- ``cpu_bf16_training``: fairseq's parser takes ``--bf16`` to mean a TPU, so ``fairseq-train
  --cpu --bf16`` fails before its first update (``xla_device`` of a missing ``torch_xla``);
  without that it would cast the whole model to bf16. Patched: on the CPU the model and the
  optimizer stay fp32 (fp32 master weights) and every training and validation step runs
  under CPU autocast.
- ``atomic_checkpoint_copy``: ``fairseq.checkpoint_utils.save_checkpoint`` writes the first
  checkpoint of an update atomically, then *copies* it onto the others
  (``checkpoint_best.pt``, ``checkpoint_last.pt``) in place: ``fairseq-train`` killed during
  that copy leaves a truncated ``checkpoint_last.pt`` or ``checkpoint_best.pt``. Patched: the
  copy goes to a temporary file beside the target, which then replaces it.

- ``model_override_names``: ``load_checkpoint_to_cpu`` sets every ``--model-overrides`` key
  (and every keyword of ``from_pretrained``) on the checkpoint's configuration, whether or not
  any option has that name, so a misspelt override (``encoder_recursion``) is ignored without
  a word. Patched: a key that no model, task, registered component or fairseq setting
  declares is refused by name, with the closest option names.
- ``diverse_beam_search``: ``DiverseBeamSearch`` as ``build_generator`` makes it returns
  ``--beam`` candidates per step where ``SequenceGenerator`` reads ``2 x --beam``, and it
  indexes its per-sentence overlap counts by the sentences' dataset ids (the generator's
  ``original_batch_idxs``) although it made one row per sentence of the batch: with
  ``--diverse-beam-groups`` fairseq-generate fails with an ``IndexError`` for every model.
  Patched: ``candidate_multiple=2`` (its own setting for this generator), and the ids are
  mapped to the rows of the batch's first step.

- ``consumer_exit``: ``BufferedIterator`` reads batches ahead in a daemon thread that nothing
  stops. When ``fairseq-train`` stops mid-epoch (``--max-update``), that thread is still
  collating the next batches as the interpreter exits; caught inside a torch call, it ends in
  ``terminate called without an active exception`` and the process aborts (status -6) after
  the checkpoints were saved. Patched: at exit each consumer finishes its batch and stops.

- ``load_error_cause``: ``Trainer.load_checkpoint`` turns every error of loading the weights
  into ``Cannot load model parameters from checkpoint ...; please ensure that the
  architectures match``, so the last line of a refused resume or fine-tuning (another
  dictionary, another size) hides why. Patched: the last line is the cause's, with the file.

``--bf16`` on the CPU needs a processor with native bf16 (AMX or AVX512-BF16, see
:func:`cpu_has_native_bf16`); elsewhere autocast would emulate bf16, slower than fp32,
so both patches stop with :class:`CPUBF16Unsupported` (drop ``--bf16``)
instead of quietly running something other than what was asked.

Weight sharing itself needs no patch under data parallelism: a layer applied N times is
one set of parameters whose gradient autograd sums before DDP's hook sees it.
"""

import argparse
import atexit
import contextlib
import functools
import importlib.util
import logging
import os
import queue
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Set

import numpy as np
import torch
from fairseq import checkpoint_utils
from fairseq import trainer as trainer_module
from fairseq.data import data_utils, iterators
from fairseq.dataclass.configs import FairseqConfig
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.logging import metrics
from fairseq.models import distributed_fairseq_model
from fairseq.models.fairseq_model import BaseFairseqModel
from fairseq.tasks.fairseq_task import FairseqTask
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel

from .atomic_files import replacing
from .nmt_checkpoints import (allowed_checkpoint_globals, check_checkpoint_file, clear_load_error,
                              not_a_fairseq_checkpoint)
from .nmt_checkpoints import load_checkpoint as read_checkpoint  # fairseq's load_checkpoint is patched here

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Patch:
    name: str
    defect: str
    has_defect: Callable[[], bool]
    install: Callable[[], None]
    #: the upstream fairseq report of the defect ("" where none was found)
    upstream: str = ""


#: the environment variable that chooses which patches may be applied (module docstring)
PATCHES_ENV = "SRET_FAIRSEQ_PATCHES"


# ---------------------------------------------------------------- keep_last_batch
def _keep_last_batch(batch_by_size):
    @functools.wraps(batch_by_size)
    def wrapper(indices, *args, **kwargs):
        batches = batch_by_size(indices, *args, **kwargs)
        indices = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices), dtype=np.int64)
        batched = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if len(batches) else indices[:0]
        if len(batched) == len(indices):
            return batches
        dropped = indices[~np.isin(indices, batched)]
        if not wrapper.warned:
            logger.warning(
                "fairseq's batch_by_size dropped its last batch (%d of %d examples); fairseq_sret"
                " keeps it (or pass --required-batch-size-multiple 1)", len(dropped), len(indices),
            )
            wrapper.warned = True
        return list(batches) + [dropped]

    wrapper.warned = False
    wrapper.sret_patch = "keep_last_batch"
    return wrapper


def batch_by_size_drops_examples(batch_by_size=None) -> bool:
    """Does ``batch_by_size`` lose an example that does not fill a multiple-of-2 batch?"""
    batch_by_size = batch_by_size or data_utils.batch_by_size
    batches = batch_by_size(
        np.arange(3, dtype=np.int64), num_tokens_fn=lambda i: 1, max_sentences=2, required_batch_size_multiple=2
    )
    return sum(len(b) for b in batches) != 3


def _install_keep_last_batch() -> None:
    data_utils.batch_by_size = _keep_last_batch(data_utils.batch_by_size)


# ---------------------------------------------------------------- checkpoint_loading
def _clear_loading(load):
    @functools.wraps(load)
    def wrapper(path, *args, **kwargs):
        local = path if isinstance(path, str) and os.path.isfile(path) else None
        if local is not None:
            check_checkpoint_file(local)
        try:
            with allowed_checkpoint_globals():
                return load(path, *args, **kwargs)
        except Exception as exc:
            clear = clear_load_error(path, exc) if local is not None else None
            if clear is None and local is not None and isinstance(exc, (KeyError, AttributeError)):
                clear = not_a_fairseq_checkpoint(local)
            if clear is None:
                raise
            # the chained torch/pickle traceback adds nothing for a damaged or refused file
            raise clear from None

    wrapper.sret_patch = "checkpoint_loading"
    return wrapper


def fairseq_loader_fails_on_own_checkpoints(load=None) -> bool:
    """Can ``load_checkpoint_to_cpu`` not read a checkpoint holding an argparse.Namespace,
    or does its error for a truncated file not name the file?"""
    load = load or checkpoint_utils.load_checkpoint_to_cpu
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "probe.pt")
        # the smallest state fairseq's upgrade code accepts, with a Namespace as in every checkpoint
        state = {
            "args": None, "cfg": None, "model": {},
            "optimizer_history": [{"num_updates": 0, "optimizer_name": "probe", "lr_scheduler_state": {}}],
            "extra_state": {"train_iterator": None, "probe": argparse.Namespace(probe=1)},
        }
        torch.save(state, path)
        try:
            load(path)
        except Exception:
            return True
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
        try:
            load(path)
        except Exception as exc:
            return path not in str(exc)
    return True  # a truncated file loaded without an error


def _install_checkpoint_loading() -> None:
    checkpoint_utils.load_checkpoint_to_cpu = _clear_loading(checkpoint_utils.load_checkpoint_to_cpu)


def _probe_checkpoint(folder: str) -> str:
    """The smallest checkpoint fairseq's loader accepts, in ``folder``; returns its path."""
    path = os.path.join(folder, "probe.pt")
    torch.save({"args": None, "cfg": None, "model": {}, "extra_state": {"train_iterator": None},
                "optimizer_history": [{"num_updates": 0, "optimizer_name": "probe", "lr_scheduler_state": {}}]}, path)
    return path


# ---------------------------------------------------------------- model_override_names
@functools.lru_cache(maxsize=1)
def declared_option_names() -> frozenset:
    """Every option name fairseq knows of: its configuration's fields, the fields of every
    registered component's dataclass, and what every registered model and task declares
    with ``add_args``."""
    import dataclasses

    from fairseq.models import MODEL_DATACLASS_REGISTRY, MODEL_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_DATACLASS_REGISTRY, TASK_REGISTRY

    names = set()

    def fields_of(cls) -> None:
        for f in dataclasses.fields(cls):
            names.add(f.name)
            if dataclasses.is_dataclass(f.type):
                fields_of(f.type)

    fields_of(FairseqConfig)
    dataclass_types = list(MODEL_DATACLASS_REGISTRY.values()) + list(TASK_DATACLASS_REGISTRY.values())
    classes = list(MODEL_REGISTRY.values()) + list(TASK_REGISTRY.values())
    for registry in REGISTRIES.values():
        dataclass_types += list(registry["dataclass_registry"].values())
        classes += list(registry["registry"].values())
    for cls in dataclass_types:
        if dataclasses.is_dataclass(cls):
            fields_of(cls)
    for cls in classes:
        parser = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
        try:
            cls.add_args(parser)
        except Exception:  # a component whose options need others first: its dataclass was read
            continue
        names.update(action.dest for action in parser._actions)
    return frozenset(names)


class UnknownOverride(ValueError):
    """A ``--model-overrides`` key that no option has."""


def check_override_names(overrides) -> None:
    """Raise :class:`UnknownOverride` naming the keys of ``overrides`` that are no option."""
    import difflib

    if not overrides:
        return
    known = declared_option_names()
    unknown = sorted(str(k) for k in overrides if k not in known)
    if not unknown:
        return
    hints = [f"{k!r} (did you mean {' or '.join(map(repr, close))}?)" if close else repr(k)
             for k in unknown for close in [difflib.get_close_matches(k, known, n=2, cutoff=0.8)]]
    raise UnknownOverride(f"--model-overrides: no option is called {', '.join(hints)}; an override of another"
                          " name would be ignored")


def _checked_overrides(load):
    @functools.wraps(load)
    def wrapper(path, arg_overrides=None, *args, **kwargs):
        check_override_names(arg_overrides)
        return load(path, arg_overrides, *args, **kwargs)

    wrapper.sret_patch = "model_override_names"
    return wrapper


def fairseq_ignores_unknown_overrides(load=None) -> bool:
    """Does ``load_checkpoint_to_cpu`` load a checkpoint with an override that no option has?"""
    load = load or checkpoint_utils.load_checkpoint_to_cpu
    with tempfile.TemporaryDirectory() as folder:
        path = _probe_checkpoint(folder)
        try:
            load(path, {"sret_probe_no_such_option": 1})
        except UnknownOverride:
            return False
        except Exception:
            return True  # failed for another reason: the name was not what stopped it
    return True


def _install_model_override_names() -> None:
    checkpoint_utils.load_checkpoint_to_cpu = _checked_overrides(checkpoint_utils.load_checkpoint_to_cpu)


# ---------------------------------------------------------------- diverse_beam_search
def diverse_beam_search_fails(search_cls=None) -> bool:
    """Does ``DiverseBeamSearch``, built as ``FairseqTask.build_generator`` builds it, return
    fewer than the ``2 x beam`` candidates per step that ``SequenceGenerator`` reads, or fail
    at the second step of a sentence whose dataset id is not below the batch size?"""
    from fairseq import search
    from fairseq.data import Dictionary

    search_cls = search_cls or search.DiverseBeamSearch
    dictionary = Dictionary()
    for i in range(8):
        dictionary.add_symbol(f"w{i}")
    beam = 4
    strategy = search_cls(dictionary, 2, 0.5)
    ids = torch.tensor([5])  # one sentence, the sixth of its data set
    lprobs = torch.log_softmax(torch.randn(1, beam, len(dictionary)), dim=-1)
    try:
        scores, _, _ = strategy.step(0, lprobs, None, None, ids)
        strategy.step(1, lprobs, torch.zeros(1, beam, 1), None, ids)
    except IndexError:
        return True
    return scores.size(1) < 2 * beam


def _install_diverse_beam_search() -> None:
    from fairseq import search

    class DiverseBeamSearch(search.DiverseBeamSearch):
        """fairseq's diverse beam search with ``2 x beam`` candidates per step, whose overlap
        counts are kept per row of the batch (the generator gives the sentences' dataset ids)."""

        sret_patch = "diverse_beam_search"

        def __init__(self, tgt_dict, num_groups, diversity_strength, diversity_discount=1.0, candidate_multiple=2):
            super().__init__(tgt_dict, num_groups, diversity_strength, diversity_discount, candidate_multiple)

        def step(self, step, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None):
            if original_batch_idxs is not None:
                if step == 0:
                    self.first_ids = original_batch_idxs.clone()
                # each sentence's row at the first step, where its overlap counts were made
                original_batch_idxs = (original_batch_idxs[:, None] == self.first_ids[None, :]).int().argmax(dim=1)
            return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs)

    search.DiverseBeamSearch = DiverseBeamSearch


# ---------------------------------------------------------------- load_error_cause
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
        path = _probe_checkpoint(folder)
        try:
            load_checkpoint(stand_in, path)
        except Exception as exc:
            return "sret probe" not in str(exc)
        finally:
            quiet.setLevel(level)
    return True


def _install_load_error_cause() -> None:
    trainer_module.Trainer.load_checkpoint = _with_the_cause(trainer_module.Trainer.load_checkpoint)


# ---------------------------------------------------------------- cpu_ddp
class CPUFriendlyDistributedDataParallel(DistributedDataParallel):
    """DDP that ignores ``device_ids``/``output_device`` for a module on the CPU."""

    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        if all(p.device.type == "cpu" for p in module.parameters()):
            device_ids = output_device = None
        super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)


class _SeenArguments(Exception):
    def __init__(self, kwargs):
        super().__init__("probe")
        self.kwargs = kwargs


def fairseq_ddp_passes_device_ids_for_cpu() -> bool:
    """Does ``DistributedFairseqModel`` give DDP ``device_ids`` for a CPU module?

    Calls it with a stand-in DDP class that records its arguments (no process group).
    """
    real = distributed_fairseq_model.DistributedDataParallel

    def record(module, **kwargs):
        raise _SeenArguments(kwargs)

    if isinstance(real, type) and issubclass(real, CPUFriendlyDistributedDataParallel):
        return False
    args = argparse.Namespace(
        tpu=False, ddp_backend="pytorch_ddp", device_id=0, broadcast_buffers=False, bucket_cap_mb=25,
        find_unused_parameters=False, gradient_as_bucket_view=False, ddp_comm_hook="none",
    )
    distributed_fairseq_model.DistributedDataParallel = record
    try:
        distributed_fairseq_model.DistributedFairseqModel(args, torch.nn.Linear(1, 1), None, torch.device("cpu"))
    except _SeenArguments as seen:
        return seen.kwargs.get("device_ids") is not None
    finally:
        distributed_fairseq_model.DistributedDataParallel = real
    return False


def _install_cpu_ddp() -> None:
    distributed_fairseq_model.DistributedDataParallel = CPUFriendlyDistributedDataParallel


# ---------------------------------------------------------------- finished_run
def _training_modules():
    """``fairseq_cli.train`` and, under ``python -m fairseq_cli.train``, ``__main__`` too."""
    import fairseq_cli.train

    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    same = main is not None and spec is not None and spec.name == "fairseq_cli.train"
    return [fairseq_cli.train] + ([main] if same and main is not fairseq_cli.train else [])


def past_the_limits(cfg, trainer) -> bool:
    """Has the run already made ``--max-update`` updates or trained ``--stop-time-hours``?"""
    max_update = cfg.optimization.max_update or float("inf")
    hours = cfg.optimization.stop_time_hours or 0
    return trainer.get_num_updates() >= max_update or (
        hours > 0 and trainer.cumulative_training_time() / 3600 > hours)


def _no_epoch_when(train_epoch, finished: Callable[..., Optional[str]]):
    """``fairseq_cli.train.train`` that starts no epoch while ``finished(cfg, trainer)`` says
    why the run is over (logged; training then ends as fairseq ends it, ``[None], True``)."""
    @functools.wraps(train_epoch)
    def train(cfg, trainer, task, epoch_itr):
        why = finished(cfg, trainer)
        if why:
            logger.info("%s: no further training", why)
            return [None], True
        return train_epoch(cfg, trainer, task, epoch_itr)

    return train


def _limits_reached(cfg, trainer) -> Optional[str]:
    if past_the_limits(cfg, trainer):
        return f"the run already reached --max-update or --stop-time-hours ({trainer.get_num_updates()} updates)"
    return None


def _stop_before_the_epoch(train_epoch):
    train = _no_epoch_when(train_epoch, _limits_reached)
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
        train_epoch = _training_modules()[0].train
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


def _install_finished_run() -> None:
    for module in _training_modules():
        module.train = _stop_before_the_epoch(module.train)


# ---------------------------------------------------------------- patience_resume
#: the key of ``--patience``'s state in a checkpoint's ``extra_state``
PATIENCE_STATE = "patience"


def _early_stop_functions():
    """``should_stop_early`` of every training module: its ``best`` and ``num_runs`` attributes are
    ``--patience``'s whole state."""
    return [module.should_stop_early for module in _training_modules()]


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


def _install_patience_resume() -> None:
    checkpoint_utils.save_checkpoint = _save_with_patience(checkpoint_utils.save_checkpoint)
    checkpoint_utils.load_checkpoint = _load_with_patience(checkpoint_utils.load_checkpoint)
    for module in _training_modules():
        module.train = _no_epoch_when(module.train, _stopped_early)


# ---------------------------------------------------------------- best_checkpoint_resume
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


def _install_best_checkpoint_resume() -> None:
    checkpoint_utils.load_checkpoint = _load_keeping_the_best(checkpoint_utils.load_checkpoint)


# ---------------------------------------------------------------- cpu_bf16_inference, cpu_bf16_training
class CPUBF16Unsupported(ValueError):
    """``--bf16`` on the CPU of a processor without native bf16."""


def cpu_has_native_bf16() -> bool:
    """Does this processor compute bf16 natively (AMX-BF16 or AVX512-BF16)?"""
    checks = [getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    if all(callable(check) for check in checks):
        return any(check() for check in checks)
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return False
    return bool(flags & {"amx_bf16", "avx512_bf16"})


def check_cpu_bf16() -> None:
    if not cpu_has_native_bf16():
        raise CPUBF16Unsupported(
            "--bf16 on the CPU computes in bf16 (training under torch.autocast, generation with bf16"
            " weights), which needs a processor with native"
            " bf16 (AMX-BF16 or AVX512-BF16, cpuinfo flags amx_bf16/avx512_bf16); this one has neither,"
            " so bf16 would be emulated, slower than fp32: drop --bf16")


def wants_cpu_bf16(common) -> bool:
    """Does the ``common`` config ask for bf16 (``--bf16`` or ``--memory-efficient-bf16``) on the CPU?

    fairseq's parser also sets ``--tpu`` for ``--bf16``; a TPU exists only where torch_xla
    is installed and ``--cpu`` was not given.
    """
    if not (getattr(common, "bf16", False) or getattr(common, "memory_efficient_bf16", False)):
        return False
    if getattr(common, "cpu", False):
        return True
    return not torch.cuda.is_available() and importlib.util.find_spec("torch_xla") is None


def _prepare_with_cpu_bf16(prepare):
    @functools.wraps(prepare)
    def prepare_for_inference_(self, cfg):
        prepare(self, cfg)
        common = getattr(cfg, "common", None)
        wanted = common is not None and wants_cpu_bf16(common)
        if wanted:
            check_cpu_bf16()
            self.to(torch.bfloat16)

    prepare_for_inference_.sret_patch = "cpu_bf16_inference"
    return prepare_for_inference_


class _Recorded(Exception):
    pass


def fairseq_ignores_bf16_in_generation(prepare=None, inference_step=None) -> bool:
    """Does a model prepared for inference with ``--cpu --bf16`` generate in fp32?

    Calls ``prepare_for_inference_`` and ``FairseqTask.inference_step`` with a one-layer
    model and a stand-in generator that records whether the weights it gets are bf16.
    """
    from types import SimpleNamespace

    prepare = prepare or BaseFairseqModel.prepare_for_inference_
    inference_step = inference_step or FairseqTask.inference_step

    class Model(BaseFairseqModel):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

    class Generator:
        def generate(self, models, sample, **kwargs):
            raise _Recorded(models[0].linear.weight.dtype == torch.bfloat16)

    cfg = SimpleNamespace(common=SimpleNamespace(cpu=True, bf16=True, tpu=True), generation=SimpleNamespace(beam=1))
    model = Model()
    try:
        prepare(model, cfg)
        inference_step(None, Generator(), [model], {})
    except CPUBF16Unsupported:
        return False  # refused with a clear message: not ignored
    except _Recorded as seen:
        return not seen.args[0]
    return True


def _install_cpu_bf16_inference() -> None:
    BaseFairseqModel.prepare_for_inference_ = _prepare_with_cpu_bf16(BaseFairseqModel.prepare_for_inference_)


@contextlib.contextmanager
def _without_bf16(common, active: bool):
    """Hide ``--bf16`` from fairseq's own mixed precision (model cast, FP16Optimizer, sample cast)."""
    if not active:
        yield
        return
    saved = common.bf16, common.memory_efficient_bf16
    common.bf16 = common.memory_efficient_bf16 = False
    try:
        yield
    finally:
        common.bf16, common.memory_efficient_bf16 = saved


def _no_tpu(cfg) -> None:
    """Undo the ``--tpu`` that fairseq's parser adds for ``--bf16`` (the groups keep copies)."""
    for group in ("common", "distributed_training", "optimizer"):
        section = getattr(cfg, group, None)
        if section is not None and getattr(section, "tpu", None):
            section.tpu = False


class CPUAutocastTrainer(trainer_module.Trainer):
    """fairseq's Trainer; with ``--bf16`` on the CPU the model and the optimizer stay fp32
    (fp32 master weights) and each training and validation step runs under
    ``torch.autocast("cpu", torch.bfloat16)``."""

    def __init__(self, cfg, task, model, criterion, quantizer=None):
        if isinstance(cfg, argparse.Namespace):
            cfg = convert_namespace_to_omegaconf(cfg)
        self.cpu_autocast = wants_cpu_bf16(cfg.common)
        if self.cpu_autocast:
            check_cpu_bf16()
            _no_tpu(cfg)
        with _without_bf16(cfg.common, self.cpu_autocast):
            super().__init__(cfg, task, model, criterion, quantizer)

    def _build_optimizer(self):
        with _without_bf16(self.cfg.common, self.cpu_autocast):
            return super()._build_optimizer()

    def _fp_convert_sample(self, sample):
        return sample if self.cpu_autocast else super()._fp_convert_sample(sample)

    def train_step(self, samples, raise_oom=False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cpu_autocast):
            return super().train_step(samples, raise_oom=raise_oom)

    def valid_step(self, sample, raise_oom=False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cpu_autocast):
            return super().valid_step(sample, raise_oom=raise_oom)


def _call_main_on_the_cpu(call_main):
    @functools.wraps(call_main)
    def wrapper(cfg, main, **kwargs):
        if wants_cpu_bf16(cfg.common):
            check_cpu_bf16()
            _no_tpu(cfg)
        return call_main(cfg, main, **kwargs)

    wrapper.sret_patch = "cpu_bf16_training"
    return wrapper


def fairseq_trains_cpu_bf16_badly(trainer_cls=None) -> bool:
    """Does fairseq's Trainer, given ``--cpu --bf16`` (with the ``--tpu`` fairseq's parser
    adds), fail, leave the CPU, or cast the model to bf16?"""
    trainer_cls = trainer_cls or trainer_module.Trainer
    cfg = OmegaConf.structured(FairseqConfig())
    cfg.common.cpu = cfg.common.bf16 = cfg.common.tpu = True
    with metrics.aggregate(new_root=True):
        try:
            trainer = trainer_cls(cfg, None, torch.nn.Linear(2, 2), torch.nn.Module())
        except CPUBF16Unsupported:
            return False  # refused with a clear message
        except Exception:
            return True
    return trainer.device.type != "cpu" or next(trainer.model.parameters()).dtype != torch.float32


def _install_cpu_bf16_training() -> None:
    trainer_module.Trainer = CPUAutocastTrainer
    for module in _training_modules():
        module.Trainer = CPUAutocastTrainer
    distributed_utils.call_main = _call_main_on_the_cpu(distributed_utils.call_main)


# ---------------------------------------------------------------- atomic_checkpoint_copy
class AtomicCopyPathManager:
    """fairseq's ``PathManager`` whose ``copy`` onto a local file writes a temporary file
    beside the target and renames it over the target (a reader, or a process killed at any
    moment, sees the old file or the new one)."""

    sret_patch = "atomic_checkpoint_copy"

    def __init__(self, base):
        self._base = base

    def __getattr__(self, name):
        return getattr(self._base, name)

    def copy(self, src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        folder = os.path.dirname(os.path.abspath(dst_path))
        if "://" in str(dst_path) or not os.path.isdir(folder) or (os.path.exists(dst_path) and not overwrite):
            return self._base.copy(src_path, dst_path, overwrite=overwrite)
        with replacing(dst_path) as tmp:
            copied = self._base.copy(src_path, str(tmp), overwrite=True)
        return copied


def checkpoints_copied_in_place(path_manager=None) -> bool:
    """Does the ``PathManager.copy`` that ``save_checkpoint`` uses write into the existing
    target file (a hard link to the target sees the new content) instead of replacing it?"""
    path_manager = path_manager or checkpoint_utils.PathManager
    with tempfile.TemporaryDirectory() as folder:
        src, dst, link = (os.path.join(folder, name) for name in ("new.pt", "last.pt", "link.pt"))
        for path, text in ((src, "new"), (dst, "old")):
            with open(path, "w") as f:
                f.write(text)
        os.link(dst, link)
        path_manager.copy(src, dst, overwrite=True)
        with open(link) as f:
            return f.read() == "new"


def _install_atomic_checkpoint_copy() -> None:
    checkpoint_utils.PathManager = AtomicCopyPathManager(checkpoint_utils.PathManager)


# ---------------------------------------------------------------- consumer_exit
class _UntilStopped:
    """``source``'s items until ``stop`` is set; checked before each item is read, so a
    consumer asked to stop finishes the batch it is collating and reads no other."""

    def __init__(self, source, stop: threading.Event):
        self.source, self.stop = source, stop

    def __len__(self):
        return len(self.source)

    def __iter__(self):
        items = iter(self.source)
        while not self.stop.is_set():
            try:
                item = next(items)
            except StopIteration:
                return
            yield item


#: the live consumers that :func:`stop_consumers` stops when the process exits
_CONSUMERS: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


class StoppableBackgroundConsumer(iterators.BackgroundConsumer):
    """fairseq's batch-reading daemon thread, with a ``stop`` event that ends its loop."""

    def __init__(self, queue_, source, max_len, cuda_device):
        self.stop = threading.Event()
        super().__init__(queue_, _UntilStopped(source, self.stop), max_len, cuda_device)
        _CONSUMERS.add(self)


def stop_consumers(timeout: float = 30.0) -> None:
    """Stop every live consumer and wait for it (at most ``timeout`` seconds in all): each
    finishes its batch, its queue is emptied so that no ``put`` blocks, and it ends."""
    consumers = [c for c in list(_CONSUMERS) if c.is_alive()]
    for consumer in consumers:
        consumer.stop.set()
    deadline = time.monotonic() + timeout
    for consumer in consumers:
        while consumer.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                while True:
                    consumer._queue.get_nowait()
            consumer.join(0.01)


def consumer_outlives_its_iterator() -> bool:
    """Is ``BufferedIterator``'s reading thread a daemon left running, with nothing to stop it,
    when its iterator is abandoned mid-epoch (as ``fairseq-train`` leaves it at
    ``--max-update``)? Such a thread is still inside torch when the interpreter exits."""
    iterator = iterators.BufferedIterator(1, list(range(3)))
    next(iterator)  # the consumer has read on and waits to put the next item
    consumer = iterator._consumer
    outlives = consumer.daemon and consumer.is_alive() and not isinstance(consumer, StoppableBackgroundConsumer)
    while consumer.is_alive():  # let the probe's own thread finish
        with contextlib.suppress(queue.Empty):
            iterator._queue.get(timeout=0.01)
    return outlives


def _install_consumer_exit() -> None:
    iterators.BackgroundConsumer = StoppableBackgroundConsumer
    atexit.register(stop_consumers)


# ---------------------------------------------------------------- registry
FAIRSEQ_ISSUES = "https://github.com/facebookresearch/fairseq/issues/"

PATCHES = (
    Patch("keep_last_batch", "batch_by_size drops the last batch (generation skips test sentences)",
          batch_by_size_drops_examples, _install_keep_last_batch, FAIRSEQ_ISSUES + "5036"),
    Patch("model_override_names", "load_checkpoint_to_cpu takes --model-overrides keys that no option has"
          " and ignores them", fairseq_ignores_unknown_overrides, _install_model_override_names),
    Patch("checkpoint_loading", "load_checkpoint_to_cpu cannot read fairseq's own checkpoints with torch's"
          " safe loading and does not name the file or the cause of a damaged or unsafe one",
          fairseq_loader_fails_on_own_checkpoints, _install_checkpoint_loading, FAIRSEQ_ISSUES + "5610"),
    Patch("diverse_beam_search", "DiverseBeamSearch returns --beam candidates where the generator reads"
          " 2 x --beam, and indexes its overlap counts by dataset id (--diverse-beam-groups fails)",
          diverse_beam_search_fails, _install_diverse_beam_search),
    Patch("load_error_cause", "Trainer.load_checkpoint hides why the weights do not load ('please ensure that"
          " the architectures match')", load_errors_hide_their_cause, _install_load_error_cause),
    Patch("cpu_ddp", "DistributedFairseqModel passes device_ids for CPU modules (CPU DDP fails)",
          fairseq_ddp_passes_device_ids_for_cpu, _install_cpu_ddp, FAIRSEQ_ISSUES + "2879"),
    Patch("finished_run", "fairseq-train makes one more update on a run that already reached --max-update"
          " or --stop-time-hours", finished_run_trains_again, _install_finished_run),
    Patch("patience_resume", "--patience forgets its count when a run resumes (the first validation after"
          " the resume becomes its best)", patience_lost_on_resume, _install_patience_resume,
          FAIRSEQ_ISSUES + "3531"),
    Patch("best_checkpoint_resume", "a run resumed after a kill between writing checkpoint_best.pt and"
          " checkpoint_last.pt lets a worse validation replace the best checkpoint",
          best_checkpoint_forgotten_on_resume, _install_best_checkpoint_resume),
    Patch("cpu_bf16_inference", "generation accepts --bf16 and ignores it (fp32 on the CPU)",
          fairseq_ignores_bf16_in_generation, _install_cpu_bf16_inference),
    Patch("atomic_checkpoint_copy", "save_checkpoint copies checkpoint_best.pt/checkpoint_last.pt in place"
          " (a kill during the copy truncates them)", checkpoints_copied_in_place, _install_atomic_checkpoint_copy),
    Patch("cpu_bf16_training", "fairseq-train --cpu --bf16 asks for a TPU and would cast the model to bf16",
          fairseq_trains_cpu_bf16_badly, _install_cpu_bf16_training, FAIRSEQ_ISSUES + "4696"),
    Patch("consumer_exit", "the thread that reads batches ahead is left running when fairseq-train stops"
          " mid-epoch, and the interpreter's exit can abort the process inside it",
          consumer_outlives_its_iterator, _install_consumer_exit),
)

#: ``{patch name: "applied" | "not needed" | "turned off"}`` once :func:`apply_patches` has run.
APPLIED: Dict[str, str] = {}


def patches_turned_off(value: Optional[str]) -> Set[str]:
    """The patch names that ``SRET_FAIRSEQ_PATCHES=value`` leaves out (module docstring);
    ValueError naming the variable, the unknown names and the known ones."""
    names = [p.name for p in PATCHES]
    text = (value or "").strip()
    if text in ("", "all"):
        return set()
    if text == "none":
        return set(names)
    items = [item.strip() for item in text.split(",") if item.strip()]
    wrong = [item for item in items if not item.startswith("-") or item[1:] not in names]
    if wrong:
        raise ValueError(
            f"{PATCHES_ENV}={value!r}: {', '.join(wrong)} not understood; give 'all', 'none' or patch names to"
            f" leave out, each with a '-' (e.g. -{names[0]}); the patches: {', '.join(names)}"
        )
    return {item[1:] for item in items}


def probe(patch: Patch) -> bool:
    """``patch.has_defect()``, or True where the probe itself fails (a temporary folder that is
    read-only or full, ...): each patch changes only what its defect breaks, so applying one
    that was not needed is harmless, while an error here would stop every ``fairseq-train``."""
    try:
        return patch.has_defect()
    except Exception as exc:
        logger.warning("fairseq_sret cannot probe fairseq for %s (%s: %s); applying the patch",
                       patch.name, type(exc).__name__, exc)
        return True


def apply_patches() -> Dict[str, str]:
    """Probe the installed fairseq and install the patches it needs and
    ``SRET_FAIRSEQ_PATCHES`` allows (once per process); one log line lists the outcome."""
    turned_off = patches_turned_off(os.environ.get(PATCHES_ENV))
    new = []
    for patch in PATCHES:
        if patch.name in APPLIED:
            continue
        if patch.name in turned_off:
            APPLIED[patch.name] = "turned off"
        elif probe(patch):
            patch.install()
            APPLIED[patch.name] = "applied"
        else:
            APPLIED[patch.name] = "not needed"
        new.append(patch.name)
    if new:
        def listed(outcome):
            return ", ".join(n for n in new if APPLIED[n] == outcome) or "none"

        logger.info("fairseq patches applied: %s; not needed: %s; turned off (%s): %s (docs/fairseq_patches.md)",
                    listed("applied"), listed("not needed"), PATCHES_ENV, listed("turned off"))
    return dict(APPLIED)
