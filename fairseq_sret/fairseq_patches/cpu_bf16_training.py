"""The ``cpu_bf16_training`` patch: fairseq's parser takes ``--bf16`` to mean a TPU, so
``fairseq-train --cpu --bf16`` fails before its first update (``xla_device`` of a missing
``torch_xla``); without that it would cast the whole model to bf16. Patched: on the CPU the
model and the optimizer stay fp32 (fp32 master weights) and every training and validation step
runs under CPU autocast.
"""

import argparse
import contextlib
import functools

import torch
from fairseq import trainer as trainer_module
from fairseq.dataclass.configs import FairseqConfig
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils
from fairseq.logging import metrics
from omegaconf import OmegaConf

from .common import training_modules, CPUBF16Unsupported, check_cpu_bf16, wants_cpu_bf16


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


def install(patch) -> None:
    patch.replace(trainer_module, "Trainer", CPUAutocastTrainer)
    for module in training_modules():
        patch.replace(module, "Trainer", CPUAutocastTrainer)
    patch.replace(distributed_utils, "call_main", _call_main_on_the_cpu(distributed_utils.call_main))
