"""Import time of the package's entry points against ``import torch`` alone.

    python -m benchmarks.bench_import [--repeats 5]

Each import runs in a fresh interpreter; the best wall time of ``--repeats`` runs is
reported (imports are I/O- and cache-bound: the minimum is the stable figure). Also
checks what each import pulls in: the pure-PyTorch parts must not import fairseq.
"""

import subprocess
import sys
import time

import torch

from benchmarks.common import benchmark_parser, finish_benchmark, positive_int, print_table, start_benchmark

IMPORTS = ["torch", "fairseq_sret", "fairseq_sret.core", "fairseq_sret.vision", "fairseq_sret.models"]


def time_import(module: str, repeats: int) -> tuple:
    code = f"import sys, {module}; print('fairseq' in sys.modules)"
    best, loads_fairseq = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
        best = min(best, time.perf_counter() - start)
        loads_fairseq = out.strip().splitlines()[-1] == "True"
    return best, loads_fairseq


def build_parser():
    p = benchmark_parser(__doc__, smoke=False, device=False, threads=False)
    p.add_argument("--repeats", type=positive_int, default=5)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    start_benchmark(args, torch.device("cpu"))
    rows, base = [], None
    for module in IMPORTS:
        seconds, loads_fairseq = time_import(module, args.repeats)
        base = base or seconds
        rows.append([f"`{module}`", f"{seconds:.2f}", f"{seconds / base:.2f}x", "yes" if loads_fairseq else "no"])
    print_table(f"import time, best of {args.repeats} fresh interpreters",
                ["import", "best of runs (s)", "ratio to `import torch`", "imports fairseq"], rows)
    finish_benchmark(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
