"""The machine a figure was measured on, named the same way by the commands, the experiment
runner and the benchmarks."""

import platform
from pathlib import Path
from typing import Optional


def cpu_model(cpuinfo: Optional[str] = None) -> str:
    """The processor's model name with its family and model numbers (``/proc/cpuinfo``, or the
    text ``cpuinfo``), for the hardware line of every figure: virtual machines often report a
    bare "AMD EPYC" or "Intel(R) Xeon(R) Processor" for several generations, whose CPU seconds
    do not compare."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    first_processor = cpuinfo.strip().split("\n\n", 1)[0]
    fields = {key.strip(): value.strip() for key, sep, value in
              (line.partition(":") for line in first_processor.splitlines()) if sep}
    name = fields.get("model name")
    if not name:
        return platform.processor() or platform.machine()
    if fields.get("cpu family") and fields.get("model"):
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def device_name(cpu: bool = False) -> str:
    """The first GPU's name, or ``CPU <model>`` with ``cpu`` or where there is no GPU."""
    import torch

    if not cpu and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU {cpu_model()}"
