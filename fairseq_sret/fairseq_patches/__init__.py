"""Every change fairseq-sret makes to fairseq's behaviour: one module per defect, one
:class:`~fairseq_sret.patching.PatchSet` (:data:`FAIRSEQ_PATCHES`; the machinery, shared with
the transformers patches, is :mod:`fairseq_sret.patching`).

:func:`apply_patches` runs when ``fairseq_sret.models`` is imported (``--user-dir
fairseq_sret`` does that). Each :class:`Patch` names the upstream defect it works around and
has a probe that shows the defect on the installed fairseq; a patch whose probe finds fairseq
already behaving is skipped. :data:`APPLIED` records what was done, and one log line says it
(``fairseq_sret.fairseq_patches`` logger, level INFO). Every replacement a patch makes is
recorded, so :func:`remove_patches` restores fairseq as it was (last installed, first
removed) and :func:`patches_removed` does it for the length of a ``with`` block (tests).

``SRET_FAIRSEQ_PATCHES`` in the environment chooses what may be applied: unset or ``all``
(each patch its probe asks for), ``none``, or names to leave out, each with a ``-``
(``-cpu_ddp,-keep_last_batch``). docs/fairseq_patches.md is the table of the patches: what
each fixes, the upstream report, and when its probe applies it.

Each patch is a module of this package with its probe, its ``install(patch)`` and the
defect in its docstring: ``keep_last_batch``, ``model_override_names``,
``checkpoint_loading``, ``diverse_beam_search``, ``load_error_cause``, ``cpu_ddp``,
``finished_run``, ``patience_resume``, ``best_checkpoint_resume``, ``cpu_bf16_inference``,
``atomic_checkpoint_copy``, ``cpu_bf16_training``, ``consumer_exit``; what several share is in
:mod:`.common`. Where two patches wrap one fairseq function, :attr:`Patch.after` says which
wraps the other (:data:`PATCHES` installs in that order, and importing checks it).

``--bf16`` on the CPU needs a processor with native bf16 (AMX or AVX512-BF16, see
:func:`cpu_has_native_bf16`); elsewhere autocast would emulate bf16, slower than fp32,
so both bf16 patches stop with :class:`CPUBF16Unsupported` (drop ``--bf16``)
instead of quietly running something other than what was asked.

Weight sharing itself needs no patch under data parallelism: a layer applied N times is
one set of parameters whose gradient autograd sums before DDP's hook sees it.
"""

import contextlib
import logging
from typing import Callable, Dict, Iterator, List, Optional, Set

from ..patching import Installation, Patch, PatchSet, check_order

from . import (atomic_checkpoint_copy, best_checkpoint_resume, checkpoint_loading, consumer_exit, cpu_bf16_inference,
               cpu_bf16_training, cpu_ddp, diverse_beam_search, finished_run, keep_last_batch, load_error_cause,
               model_override_names, patience_resume, tensor_sizes)
from .atomic_checkpoint_copy import AtomicCopyPathManager, checkpoints_copied_in_place
from .best_checkpoint_resume import best_checkpoint_forgotten_on_resume
from .checkpoint_loading import fairseq_loader_fails_on_own_checkpoints
from .common import CPUBF16Unsupported, check_cpu_bf16, cpu_has_native_bf16, wants_cpu_bf16
from .consumer_exit import StoppableBackgroundConsumer, consumer_outlives_its_iterator, stop_consumers
from .cpu_bf16_inference import fairseq_ignores_bf16_in_generation
from .cpu_bf16_training import CPUAutocastTrainer, fairseq_trains_cpu_bf16_badly
from .cpu_ddp import CPUFriendlyDistributedDataParallel, fairseq_ddp_passes_device_ids_for_cpu
from .diverse_beam_search import diverse_beam_search_fails
from .finished_run import finished_run_trains_again, past_the_limits
from .keep_last_batch import batch_by_size_drops_examples
from .load_error_cause import CheckpointLoadError, load_errors_hide_their_cause
from .model_override_names import UnknownOverride, check_override_names, fairseq_ignores_unknown_overrides
from .patience_resume import PATIENCE_STATE, patience_lost_on_resume, patience_state, set_patience_state
from .tensor_sizes import tensor_sizes_warn

__all__ = [
    "APPLIED", "FAIRSEQ_PATCHES", "PATCHES", "PATCHES_ENV", "Installation", "Patch", "PatchSet", "apply_patches",
    "check_order", "patches_removed",
    "patches_turned_off", "probe", "remove_patches",
    # what the patches define, for their callers and tests
    "AtomicCopyPathManager", "CPUAutocastTrainer", "CPUBF16Unsupported", "CPUFriendlyDistributedDataParallel",
    "CheckpointLoadError", "PATIENCE_STATE", "StoppableBackgroundConsumer", "UnknownOverride",
    "batch_by_size_drops_examples", "best_checkpoint_forgotten_on_resume", "check_cpu_bf16", "check_override_names",
    "checkpoints_copied_in_place", "consumer_outlives_its_iterator", "cpu_has_native_bf16", "diverse_beam_search_fails",
    "fairseq_ddp_passes_device_ids_for_cpu", "fairseq_ignores_bf16_in_generation", "fairseq_ignores_unknown_overrides",
    "fairseq_loader_fails_on_own_checkpoints", "fairseq_trains_cpu_bf16_badly", "finished_run_trains_again",
    "load_errors_hide_their_cause", "past_the_limits", "patience_lost_on_resume", "patience_state",
    "set_patience_state", "stop_consumers", "tensor_sizes_warn", "wants_cpu_bf16",
]

logger = logging.getLogger(__name__)


#: the environment variable that chooses which patches may be applied (module docstring)
PATCHES_ENV = "SRET_FAIRSEQ_PATCHES"
FAIRSEQ_ISSUES = "https://github.com/facebookresearch/fairseq/issues/"
LOAD_TO_CPU = "fairseq.checkpoint_utils.load_checkpoint_to_cpu"
LOAD = "fairseq.checkpoint_utils.load_checkpoint"
TRAIN = "fairseq_cli.train.train"


def _patch(module, has_defect: Callable[[], bool], name: str, defect: str, upstream: str = "", after=(),
           replaces=()) -> Patch:
    """The patch ``name`` of ``module`` (its ``install``), found by the probe ``has_defect``."""
    return Patch(name, defect, has_defect, module.install, upstream, tuple(after), tuple(replaces))


PATCHES = (
    _patch(keep_last_batch, batch_by_size_drops_examples,
           "keep_last_batch", "batch_by_size drops the last batch (generation skips test sentences)",
           FAIRSEQ_ISSUES + "5036", replaces=["fairseq.data.data_utils.batch_by_size"]),
    _patch(model_override_names, fairseq_ignores_unknown_overrides,
           "model_override_names", "load_checkpoint_to_cpu takes --model-overrides keys that"
           " no option has and ignores them", replaces=[LOAD_TO_CPU]),
    # outside the override check: a refused name is reported before the file is read
    _patch(checkpoint_loading, fairseq_loader_fails_on_own_checkpoints,
           "checkpoint_loading", "load_checkpoint_to_cpu cannot read fairseq's own checkpoints"
           " with torch's safe loading and does not name the file or the cause of a damaged or unsafe one",
           FAIRSEQ_ISSUES + "5610", after=["model_override_names"], replaces=[LOAD_TO_CPU]),
    _patch(diverse_beam_search, diverse_beam_search_fails,
           "diverse_beam_search", "DiverseBeamSearch returns --beam candidates where the"
           " generator reads 2 x --beam, and indexes its overlap counts by dataset id (--diverse-beam-groups fails)",
           replaces=["fairseq.search.DiverseBeamSearch"]),
    _patch(load_error_cause, load_errors_hide_their_cause,
           "load_error_cause", "Trainer.load_checkpoint hides why the weights do not load"
           " ('please ensure that the architectures match')", replaces=["fairseq.trainer.Trainer.load_checkpoint"]),
    _patch(cpu_ddp, fairseq_ddp_passes_device_ids_for_cpu,
           "cpu_ddp", "DistributedFairseqModel passes device_ids for CPU modules (CPU DDP fails)",
           FAIRSEQ_ISSUES + "2879", replaces=["fairseq.models.distributed_fairseq_model.DistributedDataParallel"]),
    _patch(finished_run, finished_run_trains_again,
           "finished_run", "fairseq-train makes one more update on a run that already reached"
           " --max-update or --stop-time-hours", replaces=[TRAIN]),
    # outside finished_run's check of the limits; its loading restores the count that its train reads
    _patch(patience_resume, patience_lost_on_resume,
           "patience_resume", "--patience forgets its count when a run resumes (the first"
           " validation after the resume becomes its best)", FAIRSEQ_ISSUES + "3531", after=["finished_run"],
           replaces=["fairseq.checkpoint_utils.save_checkpoint", LOAD, TRAIN]),
    # outside patience_resume's loading: the best score it restores is then compared with checkpoint_best.pt's
    _patch(best_checkpoint_resume, best_checkpoint_forgotten_on_resume,
           "best_checkpoint_resume", "a run resumed after a kill between writing"
           " checkpoint_best.pt and checkpoint_last.pt lets a worse validation replace the best checkpoint",
           after=["patience_resume"], replaces=[LOAD]),
    _patch(cpu_bf16_inference, fairseq_ignores_bf16_in_generation,
           "cpu_bf16_inference", "generation accepts --bf16 and ignores it (fp32 on the CPU)",
           replaces=["fairseq.models.fairseq_model.BaseFairseqModel.prepare_for_inference_"]),
    _patch(atomic_checkpoint_copy, checkpoints_copied_in_place,
           "atomic_checkpoint_copy", "save_checkpoint copies checkpoint_best.pt/"
           "checkpoint_last.pt in place (a kill during the copy truncates them)",
           replaces=["fairseq.checkpoint_utils.PathManager"]),
    _patch(cpu_bf16_training, fairseq_trains_cpu_bf16_badly,
           "cpu_bf16_training", "fairseq-train --cpu --bf16 asks for a TPU and would cast the"
           " model to bf16", FAIRSEQ_ISSUES + "4696",
           replaces=["fairseq.trainer.Trainer", "fairseq_cli.train.Trainer", "fairseq.distributed.utils.call_main"]),
    _patch(consumer_exit, consumer_outlives_its_iterator,
           "consumer_exit", "the thread that reads batches ahead is left running when fairseq-train"
           " stops mid-epoch, and the interpreter's exit can abort the process inside it",
           replaces=["fairseq.data.iterators.BackgroundConsumer"]),
    _patch(tensor_sizes, tensor_sizes_warn,
           "tensor_sizes", "the hub interface's LanguagePairDataset converts tensor sizes with np.array,"
           " which NumPy 2 deprecates (Tensor.__array__ takes no copy keyword)",
           replaces=["fairseq.data.language_pair_dataset.LanguagePairDataset.__init__"]),
)



# the errors users meet keep their public name in tracebacks (the last line of a refused command)
for _error in (CheckpointLoadError, CPUBF16Unsupported, UnknownOverride):
    _error.__module__ = __name__

#: fairseq's patches, in installation order
FAIRSEQ_PATCHES = PatchSet("fairseq", PATCHES, PATCHES_ENV, logger, "docs/fairseq_patches.md")
#: ``{patch name: "applied" | "not needed" | "turned off"}`` once :func:`apply_patches` has run.
APPLIED: Dict[str, str] = FAIRSEQ_PATCHES.applied


def patches_turned_off(value: Optional[str]) -> Set[str]:
    """The patch names that ``SRET_FAIRSEQ_PATCHES=value`` leaves out (:meth:`PatchSet.turned_off`)."""
    return FAIRSEQ_PATCHES.turned_off(value)


def probe(patch: Patch) -> bool:
    """``patch.has_defect()``, or True where the probe fails (:meth:`PatchSet.probe`)."""
    return FAIRSEQ_PATCHES.probe(patch)


def apply_patches() -> Dict[str, str]:
    """Probe the installed fairseq and install the patches it needs and
    ``SRET_FAIRSEQ_PATCHES`` allows (once per process); one log line lists the outcome."""
    return FAIRSEQ_PATCHES.apply()


def remove_patches() -> List[str]:
    """Undo every applied patch, the last installed first, leaving fairseq as it was."""
    return FAIRSEQ_PATCHES.remove()


@contextlib.contextmanager
def patches_removed() -> Iterator[None]:
    """fairseq without the patches inside the block, with them again after it (tests)."""
    with FAIRSEQ_PATCHES.removed():
        yield
