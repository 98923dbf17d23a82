"""The machine a figure was measured on, named the same way by the commands, the experiment
runner and the benchmarks."""

import platform
from pathlib import Path


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), for the hardware line of every figure."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(cpu: bool = False) -> str:
    """The first GPU's name, or ``CPU <model>`` with ``cpu`` or where there is no GPU."""
    import torch

    if not cpu and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU {cpu_model()}"
