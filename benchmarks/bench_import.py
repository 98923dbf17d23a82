"""Import time of the package's entry points against ``import torch`` alone.

    python -m benchmarks.bench_import [--repeats 5]

Each import runs in a fresh interpreter; the best wall time of ``--repeats`` runs is
reported (imports are I/O- and cache-bound: the minimum is the stable figure). Also
checks what each import pulls in: the pure-PyTorch parts must not import fairseq.
"""

import argparse
import subprocess
import sys
import time

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    print(f"command: python -m benchmarks.bench_import --repeats {args.repeats}")
    print("| import | best of runs (s) | ratio to `import torch` | imports fairseq |")
    print("|---|---|---|---|")
    base = None
    for module in IMPORTS:
        seconds, loads_fairseq = time_import(module, args.repeats)
        base = base or seconds
        print(f"| `{module}` | {seconds:.2f} | {seconds / base:.2f}x | {'yes' if loads_fairseq else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
