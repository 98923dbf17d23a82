"""Data-parallel training on CPUs with fairseq's own launcher.

Weight sharing needs nothing special under data parallelism: a layer applied N times is
one set of parameters whose gradient autograd sums over the N applications before DDP's
hook sees it, so every parameter is reduced exactly once per step with fairseq's
defaults (``--ddp-backend pytorch_ddp``, no ``--find-unused-parameters``), with and
without ``--checkpoint-recursions`` (non-reentrant checkpointing recomputes inside the
same backward pass). ``tests/test_distributed.py`` checks both DDP backends.

What does need a fix is fairseq itself on CPUs: ``DistributedFairseqModel`` always passes
``device_ids=[device_id]`` to ``torch.nn.parallel.DistributedDataParallel``, which refuses
CPU modules ("device_ids ... only work with ... GPU modules"), so ``fairseq-train --cpu
--distributed-world-size 2`` failed before its first update for every model. With this
plugin loaded, DDP gets ``device_ids=None`` when the module lives on the CPU; GPU runs
are unchanged. (On CPUs, start one process per rank with ``--distributed-no-spawn
--distributed-init-method tcp://HOST:PORT --distributed-rank R --distributed-backend
gloo``: fairseq's spawning launcher counts CUDA devices.)
"""

from fairseq.models import distributed_fairseq_model
from torch.nn.parallel import DistributedDataParallel


class CPUFriendlyDistributedDataParallel(DistributedDataParallel):
    """DDP that ignores ``device_ids``/``output_device`` for a module on the CPU."""

    def __init__(self, module, device_ids=None, output_device=None, **kwargs):
        if all(p.device.type == "cpu" for p in module.parameters()):
            device_ids = output_device = None
        super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)


if not issubclass(distributed_fairseq_model.DistributedDataParallel, CPUFriendlyDistributedDataParallel):
    distributed_fairseq_model.DistributedDataParallel = CPUFriendlyDistributedDataParallel
