"""What several patches share: the smallest checkpoint a probe loads, the wrapping of
fairseq's training loop, and the policy of ``--bf16`` on the CPU."""

import functools
import importlib.util
import logging
import os
import sys
from typing import Callable, Optional

import torch

logger = logging.getLogger(__name__)


def probe_checkpoint(folder: str) -> str:
    """The smallest checkpoint fairseq's loader accepts, in ``folder``; returns its path."""
    path = os.path.join(folder, "probe.pt")
    torch.save({"args": None, "cfg": None, "model": {}, "extra_state": {"train_iterator": None},
                "optimizer_history": [{"num_updates": 0, "optimizer_name": "probe", "lr_scheduler_state": {}}]}, path)
    return path


def training_modules():
    """``fairseq_cli.train`` and, under ``python -m fairseq_cli.train``, ``__main__`` too."""
    import fairseq_cli.train

    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    same = main is not None and spec is not None and spec.name == "fairseq_cli.train"
    return [fairseq_cli.train] + ([main] if same and main is not fairseq_cli.train else [])


def no_epoch_when(train_epoch, finished: Callable[..., Optional[str]]):
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
