"""The ``cpu_bf16_inference`` patch: ``fairseq-generate``, ``fairseq-interactive`` and the hub
interface accept ``--bf16`` and ignore it (they honour only ``--fp16``). Patched: with
``--bf16`` on the CPU, ``prepare_for_inference_`` casts the model to bf16, as fairseq's
generation does with ``model.half()`` for ``--fp16`` (fairseq's search still scores in fp32).
Autocast with fp32 weights is slower: it casts every LayerNorm and residual output back to
bf16 before the next linear.
"""

import functools

import torch
from fairseq.models.fairseq_model import BaseFairseqModel
from fairseq.tasks.fairseq_task import FairseqTask

from .common import CPUBF16Unsupported, check_cpu_bf16, wants_cpu_bf16


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


def install(patch) -> None:
    patch.replace(BaseFairseqModel, "prepare_for_inference_", _prepare_with_cpu_bf16(BaseFairseqModel.prepare_for_inference_))
