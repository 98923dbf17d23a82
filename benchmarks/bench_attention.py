"""Benchmark the sliced group attention.

    python -m benchmarks.bench_attention                       # CUDA if available, else CPU
    python -m benchmarks.bench_attention --device cpu --threads 2
    python -m benchmarks.bench_attention --smoke               # tiny sizes, seconds (CI)

Table 1, "G scaling": for every sequence length L and group count G,
  * attention only: ``F.scaled_dot_product_attention`` on the grouped queries, keys and
    values, (B*G, H, L/G, d) -- the scores, the softmax and the weighted sum, which is what
    slicing makes cheaper (Theorem 1: 1/G of the FLOPs);
  * the whole module: ``SlicedGroupAttention`` (q/k/v projection, partition, attention,
    output projection), contiguous partition;
forward+backward time (and forward time for the attention), the speed-up over G=1 measured
in the same process, and the peak memory of one forward+backward above the inputs.
Targets: at L=1024, G=8 the attention runs >= 5x faster than G=1 on CUDA and
>= 4x on CPU.

Table 2, "G=1 parity": our module with one group against ``F.scaled_dot_product_attention``
called directly plus the same two projections (same weights); target ratio <= 1.05. For
context also torch's ``nn.MultiheadAttention`` and, when installed, timm's ViT ``Attention``
and fairseq's ``MultiheadAttention``.

Table 3, "one kernel": sliced attention of short (and padded) sequences computed two ways,
packed groups (reshape, or a partition plus gathers when padded) against one attention
kernel over the whole sequence with a group mask (``fast_paths(grouped_one_kernel=...)``),
with G=1 for reference: the data behind ``core.attention.ONE_KERNEL_MAX_LENGTH`` (the
longest sequence that takes the one-kernel path by default, per device). Table 1's module
rows always use packed groups.

The batch holds ``--tokens`` tokens (B = tokens / L), so every length sees the same amount
of work outside the attention; width ``--embed-dim`` and ``--heads`` heads (default 512 and
8: head size 64). CUDA runs in bfloat16 (weights and activations), CPU in float32.
"""

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import (
    benchmark_parser, groups_divide_a_length, heads_divide_width, non_negative_int, positive_int,
    clock_note, default_clock, finish_benchmark, fmt_ratio, measure, median, mib, peak_memory,
    print_table, quiet_logging, start_benchmark,
)
from fairseq_sret.core import SlicedGroupAttention, fast_paths
from fairseq_sret.core.attention import ONE_KERNEL_MAX_LENGTH

TARGET_SPEEDUP = {"cuda": 5.0, "cpu": 4.0}


def build_parser():
    p = benchmark_parser(__doc__, smoke="tiny sizes, a few seconds (harness check)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--lengths", type=positive_int, nargs="+", default=[128, 512, 1024, 4096])
    p.add_argument("--groups", type=positive_int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--embed-dim", type=positive_int, default=512)
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--tokens", type=positive_int, default=None,
                   help="tokens per batch, B = tokens / L (default 16384 on CUDA, 4096 on CPU)")
    p.add_argument("--warmup", type=non_negative_int, default=None)
    p.add_argument("--iters", type=positive_int, default=None)
    p.add_argument("--rounds", type=positive_int, default=None)
    p.add_argument("--clock", choices=["wall", "cpu"], default=None,
                   help="timer: wall-clock, or this process's CPU time (default: cpu for single-threaded CPU"
                        " runs, where other load on a shared machine inflates wall time, else wall)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory columns")
    p.add_argument("--skip-parity", action="store_true")
    p.add_argument("--skip-scaling", action="store_true")
    p.add_argument("--skip-one-kernel", action="store_true")
    p.add_argument("--one-kernel-lengths", type=positive_int, nargs="+", default=[16, 32, 64, 128, 256, 512])
    p.add_argument("--one-kernel-groups", type=positive_int, nargs="+", default=[2, 8])
    p.add_check(heads_divide_width())
    p.add_check(groups_divide_a_length())
    p.add_check(lambda args: None if max(args.one_kernel_groups) <= max(args.one_kernel_lengths) else
                f"--one-kernel-groups {max(args.one_kernel_groups)} is longer than every --one-kernel-lengths:"
                " nothing would be measured")
    return p


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.lengths, args.groups = [16, 32], [1, 2, 4]
        args.one_kernel_lengths, args.one_kernel_groups = [16], [2]
        args.embed_dim, args.heads, args.tokens = 32, 4, 64
        args.warmup, args.iters, args.rounds = 1, 1, 1
    return args


def _dtype(args, device):
    if args.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, args.dtype)


def _defaults(args, device):
    cuda = device.type == "cuda"
    args.tokens = args.tokens or (16384 if cuda else 4096)
    args.warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    args.iters = args.iters or (10 if cuda else 2)
    args.rounds = args.rounds or (3 if cuda else 3)


class DirectSDPA(nn.Module):
    """The baseline: the same projections, ``F.scaled_dot_product_attention`` called directly."""

    def __init__(self, attn: SlicedGroupAttention):
        super().__init__()
        self.heads, self.dim = attn.num_heads, attn.embed_dim
        self.qkv_w, self.qkv_b = attn.qkv.weight, attn.qkv.bias
        self.out_w, self.out_b = attn.out_proj.weight, attn.out_proj.bias

    def forward(self, x):
        b, l, c = x.shape
        q, k, v = F.linear(x, self.qkv_w, self.qkv_b).view(b, l, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return F.linear(out.transpose(1, 2).reshape(b, l, c), self.out_w, self.out_b)


class TorchMHA(nn.Module):
    def __init__(self, attn: SlicedGroupAttention):
        super().__init__()
        self.mha = nn.MultiheadAttention(attn.embed_dim, attn.num_heads, batch_first=True)
        with torch.no_grad():
            self.mha.in_proj_weight.copy_(attn.qkv.weight)
            self.mha.in_proj_bias.copy_(attn.qkv.bias)
            self.mha.out_proj.weight.copy_(attn.out_proj.weight)
            self.mha.out_proj.bias.copy_(attn.out_proj.bias)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def _timm_attention(attn):
    try:
        from timm.models.vision_transformer import Attention
    except Exception:
        return None
    m = Attention(attn.embed_dim, num_heads=attn.num_heads, qkv_bias=True)
    with torch.no_grad():
        m.qkv.weight.copy_(attn.qkv.weight)
        m.qkv.bias.copy_(attn.qkv.bias)
        m.proj.weight.copy_(attn.out_proj.weight)
        m.proj.bias.copy_(attn.out_proj.bias)
    return m


class FairseqMHA(nn.Module):
    """fairseq's MultiheadAttention in its (T, B, C) layout."""

    def __init__(self, attn):
        super().__init__()
        from fairseq.modules import MultiheadAttention

        self.mha = MultiheadAttention(attn.embed_dim, attn.num_heads, self_attention=True)
        c = attn.embed_dim
        with torch.no_grad():
            for i, proj in enumerate((self.mha.q_proj, self.mha.k_proj, self.mha.v_proj)):
                proj.weight.copy_(attn.qkv.weight[i * c:(i + 1) * c])
                proj.bias.copy_(attn.qkv.bias[i * c:(i + 1) * c])
            self.mha.out_proj.weight.copy_(attn.out_proj.weight)
            self.mha.out_proj.bias.copy_(attn.out_proj.bias)

    def forward(self, x):
        t = x.transpose(0, 1)
        return self.mha(t, t, t, need_weights=False)[0].transpose(0, 1)


def _fairseq_attention(attn):
    try:
        return FairseqMHA(attn)
    except Exception:
        return None


def fwd_bwd(module, x, grad):
    def step():
        x.grad = None
        module(x).backward(grad)
    return step


def fwd_only(module, x):
    def step():
        with torch.no_grad():
            module(x)
    return step


def packed(step, one_kernel=0):
    """``step`` under ``fast_paths(grouped_one_kernel=one_kernel)`` (0: always packed groups)."""
    def run():
        with fast_paths(grouped_one_kernel=one_kernel):
            step()
    return run


def bench_one_kernel(args, device, dtype):
    """Table 3: packed groups against one masked kernel, short and padded sequences."""
    rows = []
    c, h = args.embed_dim, args.heads
    for padded in (False, True):
        for length in args.one_kernel_lengths:
            batch = max(1, args.tokens // length)
            mask = None
            if padded:  # lengths drawn from [L/2, L], one full-length sequence
                g = torch.Generator().manual_seed(0)
                lengths = torch.randint(max(1, length // 2), length + 1, (batch,), generator=g)
                lengths[0] = length
                mask = (torch.arange(length)[None, :] >= lengths[:, None]).to(device)
            x = torch.randn(batch, length, c, device=device, dtype=dtype, requires_grad=True)
            go = torch.randn_like(x)
            fns, fwd = {}, {}
            for groups in [1] + [g for g in args.one_kernel_groups if g <= length]:
                torch.manual_seed(0)
                module = SlicedGroupAttention(c, h, groups=groups, partition="strided").to(device, dtype).train()

                def fb(module=module):
                    x.grad = None
                    module(x, key_padding_mask=mask).backward(go)

                def f(module=module):
                    with torch.no_grad():
                        module(x, key_padding_mask=mask)

                for name, limit in ((f"packed G={groups}", 0), (f"one kernel G={groups}", 10**9)):
                    if groups == 1 and limit:
                        continue
                    fns[name], fwd[name] = packed(fb, limit), packed(f, limit)
            t_fb = measure(fns, device, args.warmup, args.iters, args.rounds, args.clock)
            t_f = measure(fwd, device, args.warmup, args.iters, args.rounds, args.clock)
            base = median(t_fb["packed G=1"])
            default = ONE_KERNEL_MAX_LENGTH.get(device.type, (0, 0))[int(padded)]
            for groups in [g for g in args.one_kernel_groups if g <= length]:
                p_fb, o_fb = median(t_fb[f"packed G={groups}"]), median(t_fb[f"one kernel G={groups}"])
                p_f, o_f = median(t_f[f"packed G={groups}"]), median(t_f[f"one kernel G={groups}"])
                rows.append([
                    length, groups, batch, "yes" if padded else "no", f"{p_fb * 1e3:.3f}", f"{o_fb * 1e3:.3f}",
                    fmt_ratio(p_fb / o_fb), f"{p_f * 1e3:.3f}", f"{o_f * 1e3:.3f}", fmt_ratio(p_f / o_f),
                    f"{base * 1e3:.3f}", "one kernel" if length <= default else "packed",
                ])
            if device.type == "cuda":
                torch.cuda.empty_cache()
    print_table(
        f"attention: one kernel vs packed groups ({device.type}, {str(dtype).replace('torch.', '')}, C={c}, H={h}, "
        f"{args.tokens} tokens per batch, strided groups; whole module)",
        ["L", "G", "B", "padded", "packed fwd+bwd ms", "one kernel fwd+bwd ms", "one kernel speed-up",
         "packed fwd ms", "one kernel fwd ms", "fwd speed-up", "G=1 fwd+bwd ms", "default path"],
        rows,
    )
    return rows


def bench_scaling(args, device, dtype):
    rows = []
    c, h = args.embed_dim, args.heads
    d = c // h
    for length in args.lengths:
        batch = max(1, args.tokens // length)
        groups = [g for g in args.groups if length % g == 0]
        attn_fb, attn_f, mod_fb, mems, attn_mems = {}, {}, {}, {}, {}
        for g in groups:
            torch.manual_seed(0)
            q, k, v = (torch.randn(batch * g, h, length // g, d, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            go = torch.randn_like(q)

            def attention_step(q=q, k=k, v=v, go=go):
                for t in (q, k, v):
                    t.grad = None
                F.scaled_dot_product_attention(q, k, v).backward(go)

            def attention_fwd(q=q, k=k, v=v):
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v)

            attn_fb[g], attn_f[g] = attention_step, attention_fwd
            module = SlicedGroupAttention(c, h, groups=g, partition="contiguous").to(device, dtype).train()
            x = torch.randn(batch, length, c, device=device, dtype=dtype, requires_grad=True)
            mod_fb[g] = packed(fwd_bwd(module, x, torch.randn_like(x)))
        times_afb = measure({f"a{g}": attn_fb[g] for g in groups}, device,
                             args.warmup, args.iters, args.rounds, args.clock)
        times_af = measure({f"a{g}": attn_f[g] for g in groups}, device,
                             args.warmup, args.iters, args.rounds, args.clock)
        times_mfb = measure({f"m{g}": mod_fb[g] for g in groups}, device,
                             args.warmup, args.iters, args.rounds, args.clock)
        if not args.no_memory:
            for g in groups:
                attn_mems[g] = peak_memory(attn_fb[g], device)
                mems[g] = peak_memory(mod_fb[g], device)
        base_afb, base_af, base_mfb = (median(t[f"{p}1"]) if 1 in groups else None
                                       for t, p in ((times_afb, "a"), (times_af, "a"), (times_mfb, "m")))
        for g in groups:
            afb, af, mfb = median(times_afb[f"a{g}"]), median(times_af[f"a{g}"]), median(times_mfb[f"m{g}"])
            rows.append([
                length, g, batch, f"{afb * 1e3:.3f}", fmt_ratio(base_afb / afb if base_afb else None),
                f"{af * 1e3:.3f}", fmt_ratio(base_af / af if base_af else None),
                f"{mfb * 1e3:.3f}", fmt_ratio(base_mfb / mfb if base_mfb else None),
                mib(attn_mems.get(g)), mib(mems.get(g)),
            ])
        del attn_fb, attn_f, mod_fb
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_table(
        f"attention: G scaling ({device.type}, {str(dtype).replace('torch.', '')}, C={c}, H={h}, "
        f"{args.tokens} tokens per batch)",
        ["L", "G", "B", "attn fwd+bwd ms", "attn speed-up vs G=1", "attn fwd ms", "attn fwd speed-up",
         "module fwd+bwd ms", "module speed-up", "attn peak MiB", "module peak MiB"],
        rows,
    )
    target = TARGET_SPEEDUP.get(device.type)
    for row in rows:
        if row[0] == 1024 and row[1] == 8:
            print(f"target check: attention fwd+bwd at L=1024, G=8 = {row[4]} of G=1 (target >= {target}x on {device.type})")
    return rows


def bench_parity(args, device, dtype):
    rows = []
    c, h = args.embed_dim, args.heads
    for length in args.lengths:
        batch = max(1, args.tokens // length)
        torch.manual_seed(0)
        ours = SlicedGroupAttention(c, h, groups=1).to(device, dtype).train()
        variants = {"ours (G=1)": ours, "direct SDPA + projections": DirectSDPA(ours)}
        for name, build in (("torch nn.MultiheadAttention", TorchMHA), ("timm Attention", _timm_attention),
                            ("fairseq MultiheadAttention", _fairseq_attention)):
            m = build(ours)
            if m is not None:
                variants[name] = m.to(device, dtype).train()
        x = torch.randn(batch, length, c, device=device, dtype=dtype, requires_grad=True)
        go = torch.randn_like(x)
        with torch.no_grad():
            ref_out = variants["direct SDPA + projections"](x)
            for name, m in variants.items():
                err = (m(x) - ref_out).abs().max().item()
                if err > (1e-3 if dtype == torch.float32 else 5e-2):
                    print(f"WARNING: {name} differs from direct SDPA by {err:.3g} (L={length})")
        tfb = measure({n: fwd_bwd(m, x, go) for n, m in variants.items()}, device,
                             args.warmup, args.iters, args.rounds, args.clock)
        for m in variants.values():
            m.eval()
        tf = measure({n: fwd_only(m, x) for n, m in variants.items()}, device,
                             args.warmup, args.iters, args.rounds, args.clock)
        mems = {}
        if not args.no_memory:
            for n, m in variants.items():
                m.train()
                mems[n] = peak_memory(fwd_bwd(m, x, go), device)
        ref_fb, ref_f = median(tfb["direct SDPA + projections"]), median(tf["direct SDPA + projections"])
        for name in variants:
            fb, f = median(tfb[name]), median(tf[name])
            rows.append([length, batch, name, f"{fb * 1e3:.3f}", fmt_ratio(fb / ref_fb), f"{f * 1e3:.3f}",
                         fmt_ratio(f / ref_f), mib(mems.get(name))])
    print_table(
        f"attention: G=1 parity ({device.type}, {str(dtype).replace('torch.', '')}, C={c}, H={h}; ratio = time / "
        "direct SDPA's, target <= 1.05x for ours)",
        ["L", "B", "implementation", "fwd+bwd ms", "fwd+bwd ratio", "fwd ms", "fwd ratio", "fwd+bwd peak MiB"],
        rows,
    )
    return rows


def main(argv=None):
    args = parse_args(argv)
    quiet_logging()
    device = start_benchmark(args)
    dtype = _dtype(args, device)
    _defaults(args, device)
    args.clock = args.clock or default_clock(device)
    print(f"settings: warmup {args.warmup}, {args.iters} iterations x {args.rounds} rounds (median of rounds),"
          f" {clock_note(args.clock)}")
    if not args.skip_scaling:
        bench_scaling(args, device, dtype)
    if not args.skip_parity:
        bench_parity(args, device, dtype)
    if not args.skip_one_kernel:
        bench_one_kernel(args, device, dtype)
    finish_benchmark(args)


if __name__ == "__main__":
    main()
