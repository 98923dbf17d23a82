"""The LRC residual alone: ``skip_scale * x + branch_scale * y`` (and the LayerNorm that reads it).

    python -m benchmarks.bench_lrc                      # CUDA if available, else CPU
    python -m benchmarks.bench_lrc --device cpu --threads 1
    python -m benchmarks.bench_lrc --smoke

At the residual-stream sizes of SReT-T and SReT-S (stage 1: 784 tokens x 64 / 126 channels;
stage 2: 196 x 128 / 252), per call, inference (no_grad) and forward+backward (gradients for
x, y and both coefficients; the LayerNorm's weight and bias too in the "+ LayerNorm" rows):

  3op        ``s * x + b * y`` then ``layer_norm``: three element-wise kernels (the code before)
  one-op     ``torch.addcmul(s * x, b, y)`` with the lean backward (``fast_paths(lrc_one_op=True, fused="off")``)
  fused      the Triton kernel (CUDA with Triton only; ``fast_paths(fused="on")``, since the
             default keeps it for graph capture and compile): one kernel, LayerNorm included
  folded     ``x + y`` (a folded model's residual, inference only)

All in this one process, round-robin, median of the rounds.
"""

import torch
from torch import nn

from benchmarks.common import (
    benchmark_parser, non_negative_int, positive_int,
    clock_note, default_clock, finish_benchmark, fmt_ratio, measure, median, print_table,
    quiet_logging, start_benchmark,
)
from fairseq_sret.core import fast_paths
from fairseq_sret.core.fused import fused_kernels_active, lrc_add, lrc_add_norm

SHAPES = {"SReT-T stage 1": (784, 64), "SReT-T stage 2": (196, 128), "SReT-S stage 1": (784, 126),
          "SReT-S stage 2": (196, 252)}
MODES = {"3op": dict(lrc_one_op=False, fused="off"), "one-op": dict(lrc_one_op=True, fused="off"),
         "fused": dict(fused="on")}


def build_parser():
    p = benchmark_parser(__doc__)
    p.add_argument("--batch", type=positive_int, default=None, help="images (default 256 on CUDA, 16 on CPU)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="dtype of the branch y (the residual stream x stays float32, as under autocast)")
    p.add_argument("--warmup", type=non_negative_int, default=3)
    p.add_argument("--iters", type=positive_int, default=None)
    p.add_argument("--rounds", type=positive_int, default=5)
    p.add_argument("--clock", choices=["wall", "cpu"], default=None)
    return p


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.batch, args.warmup, args.iters, args.rounds = 2, 1, 1, 1
    return args


def main(argv=None):
    args = parse_args(argv)
    quiet_logging()
    device = start_benchmark(args)
    cuda = device.type == "cuda"
    args.batch = args.batch or (256 if cuda else 16)
    args.iters = args.iters or (20 if cuda else 10)
    args.clock = args.clock or default_clock(device)
    print(f"settings: warmup {args.warmup}, {args.iters} iterations x {args.rounds} rounds (median of rounds),"
          f" {clock_note(args.clock)}; batch {args.batch}, branch dtype {args.dtype}")
    probe = torch.zeros(1, device=device)
    with fast_paths(**MODES["fused"]):
        fused_available = fused_kernels_active(probe)
    modes = [m for m in MODES if m != "fused" or fused_available]
    if "fused" not in modes:
        print("fused: Triton kernel not active here (needs CUDA and Triton); rows omitted")
    rows = []
    for label, (tokens, channels) in SHAPES.items():
        torch.manual_seed(0)
        shape = (args.batch, tokens, channels)
        x = torch.randn(shape, device=device, requires_grad=True)
        y = torch.randn(shape, device=device).to(getattr(torch, args.dtype)).requires_grad_()
        s = torch.ones(1, device=device, requires_grad=True)
        b = torch.ones(1, device=device, requires_grad=True)
        norm = nn.LayerNorm(channels).to(device)
        g = torch.randn(shape, device=device)

        def infer(mode, with_norm):
            def step():
                with torch.no_grad(), fast_paths(**MODES[mode]):
                    return lrc_add_norm(x, y, s, b, norm) if with_norm else lrc_add(x, y, s, b)
            return step

        def train(mode, with_norm):
            def step():
                with fast_paths(**MODES[mode]):
                    if with_norm:
                        res, out = lrc_add_norm(x, y, s, b, norm)
                        torch.autograd.backward((res, out), (g, g))
                    else:
                        lrc_add(x, y, s, b).backward(g)
                x.grad = y.grad = s.grad = b.grad = None
                norm.zero_grad(set_to_none=True)
            return step

        for with_norm in (False, True):
            fns = {f"infer {m}": infer(m, with_norm) for m in modes}
            fns["infer folded"] = (lambda: (x + y, norm(x + y)) if with_norm else x + y)
            fns["infer folded"] = _no_grad(fns["infer folded"])
            fns.update({f"train {m}": train(m, with_norm) for m in modes})
            t = measure(fns, device, args.warmup, args.iters, args.rounds, args.clock)
            what = "LRC + LayerNorm" if with_norm else "LRC"
            for phase in ("infer", "train"):
                base = median(t[f"{phase} 3op"])
                for m in modes + (["folded"] if phase == "infer" else []):
                    sec = median(t[f"{phase} {m}"])
                    rows.append([label, "x".join(map(str, shape)), what, "inference" if phase == "infer" else "fwd+bwd",
                                 m, f"{sec * 1e3:.3f}", fmt_ratio(base / sec)])
    print_table(
        f"LRC residual ({device.type}): ms per call and speed-up over the three-kernel form",
        ["stream", "shape", "op", "pass", "form", "ms", "speed-up vs 3op"],
        rows,
    )
    finish_benchmark(args)


def _no_grad(fn):
    def step():
        with torch.no_grad():
            return fn()
    return step


if __name__ == "__main__":
    main()
