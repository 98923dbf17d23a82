"""torch.compile of the vision models: compile time, compiled speed, and what a depth switch costs.

    python -m benchmarks.bench_compile --threads 1                 # SReT-T against DeiT-T, CPU, Inductor
    python -m benchmarks.bench_compile --threads 1 --regional      # also the shared layers compiled one by one
    python -m benchmarks.bench_compile --smoke                     # tiny, seconds (harness check)

For each model: the first call of ``torch.compile(model)`` by the wall clock (Inductor
compiles in worker processes), cold (a fresh Inductor cache), with the graphs Dynamo made;
then images/s compiled and eager, every model round-robin in one measurement (median of
rounds, ``--clock``). For SReT, also the first call after ``set_depth(d)`` for every depth
below the trained one and then back at the full depth, with the graphs each call made:
compiling the whole model unrolls the recursions, so each new depth is a new graph.
``--regional`` adds SReT compiled with :func:`fairseq_sret.core.compile_shared_layers` (each
shared layer and NLL on its own, the recursion loop left in Python): the applications alike
share one graph and a depth switch compiles nothing new.
"""

import os
import sys
import tempfile
import time
from typing import Callable, Dict, List

import torch

from benchmarks.common import (
    benchmark_parser, clock_note, finish_benchmark, measure, median, positive_int, print_table, start_benchmark,
)


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def first_call(fn: Callable[[], object]) -> Dict[str, float]:
    """Wall seconds and new Dynamo graphs of one call."""
    before = _graphs()
    start = time.perf_counter()
    with torch.no_grad():
        fn()
    return {"s": time.perf_counter() - start, "graphs": _graphs() - before}


def build(name: str, img_size: int) -> torch.nn.Module:
    from benchmarks.bench_vision import build as build_vision_model

    torch.manual_seed(0)
    return build_vision_model(name, img_size).eval()


def build_parser():
    p = benchmark_parser(__doc__.split("\n")[0], smoke="tiny models, the eager backend, one round")
    p.set_defaults(device="cpu")
    p.add_argument("--models", nargs="+", default=["sret_t", "deit_tiny_patch16_224"])
    p.add_argument("--backend", default="inductor")
    p.add_argument("--regional", action="store_true", help="also SReT with its shared layers compiled one by one")
    p.add_argument("--batch", type=positive_int, default=16)
    p.add_argument("--img-size", type=positive_int, default=224)
    p.add_argument("--iters", type=positive_int, default=1)
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.backend, args.batch, args.img_size, args.rounds = "eager", 2, 64, 1
    # every compilation cold: a fresh Inductor cache, nothing from an earlier process
    import torch._inductor.config

    cache = tempfile.TemporaryDirectory(prefix="bench_compile_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name
    torch._inductor.config.fx_graph_cache = False
    device = start_benchmark(args)
    print(f"settings: backend {args.backend}, batch {args.batch}, {args.img_size}x{args.img_size}, no_grad, "
          f"{args.iters} iterations x {args.rounds} rounds, {clock_note(args.clock)}; first calls by the wall clock")

    from fairseq_sret.core import compile_shared_layers

    images = torch.randn(args.batch, 3, args.img_size, args.img_size, device=device)
    variants = []
    for name in args.models:
        variants.append((name, "whole model"))
        if args.regional and name.startswith("sret"):
            variants.append((name, "shared layers"))
    calls: Dict[str, Callable[[], object]] = {}
    firsts: Dict[str, Dict[str, float]] = {}
    diffs: Dict[str, float] = {}
    depth_rows: List[list] = []
    for name, how in variants:
        model = build(name, args.img_size).to(device)
        eager = build(name, args.img_size).to(device)
        if how == "whole model":
            compiled = torch.compile(model, backend=args.backend)
        else:
            compiled = compile_shared_layers(model, backend=args.backend)
        key = f"{name}, {how}"
        firsts[key] = first_call(lambda: compiled(images))
        with torch.no_grad():
            diffs[key] = (compiled(images) - eager(images)).abs().max().item()
        if hasattr(model, "set_depth"):
            for depth in [*range(1, model.recursions), None]:
                model.set_depth(depth)
                call = first_call(lambda: compiled(images))
                depth_rows.append([name, how, str(depth or model.recursions), f"{call['s']:.1f}", str(call["graphs"])])
        calls[key] = compiled
        calls.setdefault(f"{name}, eager", eager)
        print(f"compiled {key}", flush=True)

    # every variant and every eager model round-robin in one measurement
    with torch.no_grad():
        times = measure({k: (lambda m=m: m(images)) for k, m in calls.items()}, device, warmup=1, iters=args.iters,
                        rounds=args.rounds, clock=args.clock)
    speed = {k: args.batch / median(v) for k, v in times.items()}
    reference = speed.get("deit_tiny_patch16_224, whole model")
    rows = []
    for name, how in variants:
        key = f"{name}, {how}"
        rows.append([name, how, f"{firsts[key]['s']:.1f}", str(firsts[key]["graphs"]), f"{speed[key]:.1f}",
                     f"{speed[f'{name}, eager']:.1f}", f"{speed[key] / speed[f'{name}, eager']:.2f}x",
                     f"{speed[key] / reference:.2f}x" if reference else "–", f"{diffs[key]:.1e}"])
    print_table("torch.compile: first call and speed", ["model", "compiled", "first call s", "graphs",
                "compiled images/s", "eager images/s", "compiled / eager", "vs DeiT-T compiled",
                "max |compiled - eager|"], rows)
    if depth_rows:
        print_table("A depth switch after the first call: the next call", ["model", "compiled", "depth",
                    "first call s", "new graphs"], depth_rows)
    finish_benchmark(args)
    cache.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
