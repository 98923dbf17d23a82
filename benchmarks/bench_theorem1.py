"""Theorem 1 of the paper, counted.

    python -m benchmarks.bench_theorem1            # L=1024, C=512, H=8; SReT-T per stage
    python -m benchmarks.bench_theorem1 --smoke

Paper (Sec. 4, Theorem 1): the attention complexity of N recursions with G groups is
C_G-SA = N/G x C_V-SA (one global attention); equal when N = G. We count the FLOPs of the
attention itself (q k^T and attn v, what ``torch.utils.flop_counter`` charges for
scaled-dot-product attention) of N applications of ``SlicedGroupAttention`` with G groups,
and divide by N/G times the FLOPs of one global (G=1) application. The projections, which
the theorem leaves out (its footnote), are shown separately: they grow with N whatever G is.

torch's FlopCounterMode has no formula for the CPU flash-attention kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``; it counts 0), so we register the
standard SDPA formula for it and cross-check every count with the math backend
(``SDPBackend.MATH``), whose batched matrix products torch counts natively.

The second table applies the theorem to SReT-T's three stages (groups [8,2] [4,1] [1,1],
two recursions per shared block) against the same model without slicing.
"""

import contextlib
from fractions import Fraction

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from benchmarks.common import (
    benchmark_parser, finish_benchmark, groups_divide_a_length, heads_divide_width, positive_int, print_table,
    quiet_logging, start_benchmark,
)
from fairseq_sret.core import SlicedGroupAttention

aten = torch.ops.aten


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


CUSTOM = {}
if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
    CUSTOM[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_sdpa_flops

ATTENTION_OPS = ("scaled_dot_product", "bmm")  # fused kernels, or the math path's matmuls


def count(fn, math_path: bool):
    """(attention FLOPs, other FLOPs) of fn(); attention = SDPA kernels or the math path's bmm."""
    counter = FlopCounterMode(display=False, custom_mapping=CUSTOM)
    ctx = sdpa_kernel(SDPBackend.MATH) if math_path else contextlib.nullcontext()
    with torch.no_grad(), ctx, counter:
        fn()
    attention = other = 0
    for op, flops in counter.get_flop_counts()["Global"].items():
        if any(key in str(op) for key in ATTENTION_OPS):
            attention += flops
        else:
            other += flops
    return attention, other


def recursions_flops(length, dim, heads, recursions, groups, device, math_path):
    torch.manual_seed(0)
    attn = SlicedGroupAttention(dim, heads, groups=(groups,) * recursions, partition="contiguous").to(device).eval()
    x = torch.randn(1, length, dim, device=device)

    def run():
        h = x
        for r in range(recursions):
            h = attn(h, recursion=r)

    return count(run, math_path)


def fmt_g(flops: int) -> str:
    """MFLOPs"""
    return f"{flops / 1e6:.3f}"


def uncounted_check(args, device):
    """What torch's flop counter reports for the fused kernel without our registration."""
    torch.manual_seed(0)
    attn = SlicedGroupAttention(args.embed_dim, args.heads).to(device).eval()
    x = torch.randn(1, args.length, args.embed_dim, device=device)
    plain = FlopCounterMode(display=False)
    with torch.no_grad(), plain:
        attn(x)
    counts = {str(op): f for op, f in plain.get_flop_counts()["Global"].items()}
    sdpa = sum(f for op, f in counts.items() if any(k in op for k in ATTENTION_OPS))
    print(f"flop counter without registration, one global attention ({device.type}): attention ops counted "
          f"{sdpa / 1e6:.3f} MFLOPs ({', '.join(counts) or 'none'})"
          + ("  <- torch does not count the fused CPU kernel; the tables register its formula" if sdpa == 0 else ""))


def theorem_table(args, device):
    uncounted_check(args, device)
    base_fused, _ = recursions_flops(args.length, args.embed_dim, args.heads, 1, 1, device, False)
    rows, ok = [], True
    for n in args.recursions:
        for g in args.groups:
            if args.length % g:
                continue
            fused, proj = recursions_flops(args.length, args.embed_dim, args.heads, n, g, device, False)
            math, _ = recursions_flops(args.length, args.embed_dim, args.heads, n, g, device, True)
            claim = Fraction(n, g) * base_fused
            ratio = fused / claim
            ok &= fused == math and ratio == 1
            rows.append([
                n, g, f"{Fraction(n, g)}", fmt_g(fused), fmt_g(math), fmt_g(int(claim)), f"{float(ratio):.4f}",
                "yes" if n == g and fused == base_fused else ("-" if n != g else "NO"), fmt_g(proj),
            ])
    print_table(
        f"Theorem 1: attention FLOPs of N recursions with G groups vs N/G x one global attention "
        f"(L={args.length}, C={args.embed_dim}, H={args.heads}, batch 1, forward; MFLOPs; "
        f"C_V-SA = {fmt_g(base_fused)})",
        ["N", "G", "N/G (paper)", "measured, fused SDPA", "measured, math path", "N/G x C_V-SA",
         "measured / claim", "N=G equals 1 V-SA", "projections (not in theorem)"],
        rows,
    )
    print(f"Theorem 1 check: {'holds exactly' if ok else 'FAILS'} for every N, G with L divisible by G")
    return ok


def sret_stage_table(device, img_size):
    from fairseq_sret.vision import count_macs, create_model

    rows = []
    totals = {}
    for name in ("sret_t", "sret_t_wo_slice"):
        model = create_model(name, img_size=img_size).to(device).eval()
        cfg = model.cfg
        grid = cfg.img_size[0] // 8
        stage_flops = []
        for s, stage in enumerate(model.stages):
            side = grid // 2 ** s
            x = torch.randn(1, cfg.embed_dims[s], side, side, device=device)
            fused, _ = count(lambda: stage(x), False)
            math, _ = count(lambda: stage(x), True)
            if fused != math:
                print(f"WARNING: {name} stage {s + 1}: fused SDPA counted {fused} FLOPs, math path {math}")
            stage_flops.append((fused, side * side, cfg.groups[s], cfg.blocks[s]))
        totals[name] = (stage_flops, count_macs(model))
    sliced, _ = totals["sret_t"]
    glob, _ = totals["sret_t_wo_slice"]
    for s, ((f_s, length, groups, blocks), (f_g, _, _, _)) in enumerate(zip(sliced, glob)):
        claim = sum(Fraction(1, g) for g in groups) / len(groups)  # vs the same recursions without slicing
        rows.append([s + 1, length, blocks, " ".join(str(g) for g in groups), fmt_g(f_s), fmt_g(f_g),
                     f"{f_s / f_g:.4f}", f"{float(claim):.4f}"])
    print_table(
        f"Theorem 1 in SReT-T ({img_size}x{img_size}, one image): attention MFLOPs per stage, sliced vs without slice",
        ["stage", "L", "shared blocks x 2 recursions", "groups per recursion", "sliced", "without slice",
         "measured ratio", "paper: mean over recursions of 1/G"],
        rows,
    )
    print(f"whole model MACs at {img_size}x{img_size}: SReT-T {totals['sret_t'][1] / 1e9:.3f} G, without slice "
          f"{totals['sret_t_wo_slice'][1] / 1e9:.3f} G (paper, 224x224: 1.1 G and 1.4 G)")


def build_parser():
    p = benchmark_parser(__doc__, threads=False)
    p.set_defaults(device="cpu")  # FLOP counts do not depend on it
    p.add_argument("--length", type=positive_int, default=1024)
    p.add_argument("--embed-dim", type=positive_int, default=512)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--recursions", type=positive_int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--groups", type=positive_int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--img-size", type=positive_int, default=224, help="SReT-T input size for the stage table")
    p.add_argument("--skip-sret", action="store_true", help="skip the SReT-T stage table")
    p.add_check(heads_divide_width())
    p.add_check(groups_divide_a_length(lengths="length"))
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.length, args.embed_dim, args.heads = 64, 32, 4
        args.recursions, args.groups = [1, 2], [1, 2]
        args.img_size = 64
    quiet_logging()
    device = start_benchmark(args)
    ok = theorem_table(args, device)
    if not args.skip_sret:
        sret_stage_table(device, args.img_size)
    finish_benchmark(args)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
