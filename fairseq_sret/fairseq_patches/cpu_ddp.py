"""The ``cpu_ddp`` patch: ``DistributedFairseqModel`` always passes ``device_ids=[device_id]`` to
``torch.nn.parallel.DistributedDataParallel``, which refuses CPU modules, so ``fairseq-train
--cpu --distributed-world-size 2`` fails before its first update for every model. Patched: DDP
gets ``device_ids=None`` for a module on the CPU; GPU runs are unchanged. (On CPUs start one
process per rank with ``--distributed-no-spawn --distributed-init-method tcp://HOST:PORT
--distributed-rank R --distributed-backend gloo``: fairseq's spawning launcher counts CUDA
devices.)
"""

import argparse

import torch
from fairseq.models import distributed_fairseq_model
from torch.nn.parallel import DistributedDataParallel


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


def install(patch) -> None:
    patch.replace(distributed_fairseq_model, "DistributedDataParallel", CPUFriendlyDistributedDataParallel)
