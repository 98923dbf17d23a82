"""Mixed-precision checks for the GPU machine; pure PyTorch, no fairseq.

1. Attention precision: :class:`SlicedGroupAttention` under fp16 and bf16 autocast with
   attention logits up to ~75 (plain, grouped, padded, causal): the softmax must
   stay within 4 eps of float64 attention on the same half-precision q, k, v (float32
   softmax and accumulation), and the module's outputs must be finite.
2. fp16 training: the ``sret_transformer_tiny`` encoder-decoder (width 256, FFN 1024, 4
   heads, 2 unique layers x 2 recursions per side, sliced groups 2,1, NLL ratio 0.5, LRC)
   rebuilt from :mod:`fairseq_sret.core`, trained with ``torch.autocast`` + ``GradScaler``
   (initial scale 128, fairseq's ``--fp16-init-scale``) on a generated reversal task. The
   loss is printed every 10 updates, with every step the scaler skipped (gradient
   overflow) and any non-finite forward loss.

Exit status 0 when no forward loss is non-finite, no step was skipped and the attention
errors stay within half-precision rounding.

    python -m benchmarks.gpu_checks                      # the GPU check: cuda, fp16, 100 updates
    python -m benchmarks.gpu_checks --device cpu --updates 3 --batch 8   # smoke test
"""

import itertools
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import (
    benchmark_parser, heads_divide_width, non_negative_int, pick_device, positive_float, positive_int,
    start_benchmark, write_json,
)
from fairseq_sret.core import NonLinearProjection, Recursive, SlicedGroupAttention, SReTBlock
from fairseq_sret_cli.toy import reversal_batch, reversal_pairs
from fairseq_sret import json_text

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class TinySReTSeq2Seq(nn.Module):
    """The encoder-decoder of ``--arch sret_transformer_tiny`` (pre-LN, shared embeddings)."""

    def __init__(self, vocab: int, width=256, ffn=1024, heads=4, layers=2, recursions=2,
                 groups=(2, 1), nll_ratio=0.5, max_len=256, dropout=0.1):
        super().__init__()
        self.width = width
        self.embed = nn.Embedding(vocab, width)
        nn.init.normal_(self.embed.weight, std=width ** -0.5)
        self.pos = nn.Embedding(max_len, width)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.dropout = nn.Dropout(dropout)

        def stack(causal):
            partition = ("strided", "random") if causal else ("contiguous", "random")
            return nn.ModuleList([
                Recursive(
                    SReTBlock(width, heads, ffn, groups=groups, partition=partition, causal=causal,
                              cross_attention=causal, dropout=dropout, activation="relu"),
                    recursions,
                    lambda _: NonLinearProjection(width, nll_ratio, activation="relu", dropout=dropout),
                )
                for _ in range(layers)
            ])

        self.encoder, self.decoder = stack(False), stack(True)
        self.encoder_norm, self.decoder_norm = nn.LayerNorm(width), nn.LayerNorm(width)

    def _embed(self, tokens):
        positions = torch.arange(tokens.size(1), device=tokens.device)
        return self.dropout(self.embed(tokens) * self.width ** 0.5 + self.pos(positions))

    def forward(self, src, src_pad, prev):
        x = self._embed(src)
        for layer in self.encoder:
            x = layer(x, key_padding_mask=src_pad)
        memory = self.encoder_norm(x)
        y = self._embed(prev)
        for layer in self.decoder:
            y = layer(y, memory=memory, memory_padding_mask=src_pad)
        return F.linear(self.decoder_norm(y), self.embed.weight)


PAD, EOS, FIRST_WORD = 0, 1, 2  # token ids: padding, end of sentence, then the words up to --vocab


def reversal_training_batch(pairs, batch, device):
    """``batch`` reversal pairs as (src, src_pad, prev, target), right-padded with PAD."""
    src, _, prev, target = reversal_batch(list(itertools.islice(pairs, batch)), FIRST_WORD, PAD, EOS)
    return [t.to(device) for t in (src, src.eq(PAD), prev, target)]


def train(args, device, dtype) -> dict:
    torch.manual_seed(args.seed)
    words = (args.length // 2, args.length - 1)  # per sentence; with EOS at most --length tokens
    pairs = reversal_pairs(args.seed, vocab_size=args.vocab - FIRST_WORD, lengths=words)
    model = TinySReTSeq2Seq(args.vocab, width=args.width, ffn=4 * args.width, heads=max(1, args.width // 64)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    use_scaler = dtype == torch.float16
    scaler = torch.amp.GradScaler(device.type, init_scale=128.0, enabled=use_scaler)
    skipped, nonfinite, log = [], [], []
    start = time.time()
    for update in range(1, args.updates + 1):
        lr = args.lr * min(1.0, update / args.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        src, src_pad, prev, target = reversal_training_batch(pairs, args.batch, device)
        with torch.autocast(device.type, dtype=dtype):
            logits = model(src, src_pad, prev)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), target.view(-1),
                                   ignore_index=PAD, label_smoothing=0.1)
        if not torch.isfinite(loss):
            nonfinite.append(update)
        optimizer.zero_grad(set_to_none=True)
        scale_before = scaler.get_scale() if use_scaler else 1.0
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        if use_scaler and scaler.get_scale() < scale_before:
            skipped.append(update)
        log.append(loss.item())
        if update % 10 == 0 or update == args.updates:
            print(f"update {update:4d}  loss {loss.item():.4f}  scale {scaler.get_scale() if use_scaler else 1.0:g}"
                  f"  skipped {len(skipped)}  {time.time() - start:.1f}s", flush=True)
    return {"updates": args.updates, "losses_every_10": [round(v, 4) for v in log[9::10]],
            "first_loss": log[0], "last_loss": log[-1], "skipped_steps": skipped,
            "nonfinite_losses": nonfinite, "final_scale": scaler.get_scale() if use_scaler else None,
            "seconds": round(time.time() - start, 1)}


def attention_check(device, dtype, length=256) -> dict:
    """Errors of attention under autocast (``dtype``), relative to the largest output.

    ``softmax``: the module's attention kernel on half-precision q, k, v (what autocast's
    projections produce) with logits up to ~75 (exp overflows fp16 beyond 11, so the
    softmax must subtract the row maximum in float32), padding and causal masks, against
    float64 attention on the same q, k, v: with softmax and accumulation in float32 the
    error is one rounding of the output (<= eps); ``limit`` is 4 eps.
    ``module_*``: the whole module under autocast against float32 (includes the rounding of
    the projections; reported, and required finite).
    """
    eps = torch.finfo(dtype).eps
    results = {"eps": eps, "limit": 4 * eps}
    torch.manual_seed(0)
    width, heads = 64, 4
    g = torch.Generator(device="cpu").manual_seed(0)
    for name, kw in {"plain": dict(groups=1), "grouped": dict(groups=4, partition="strided"),
                     "causal": dict(groups=2, partition="strided", causal=True)}.items():
        attn = SlicedGroupAttention(width, heads, **kw).to(device).eval()
        x = (8.0 * torch.randn(3, length, width, generator=g)).to(device)
        pad = torch.zeros(3, length, dtype=torch.bool, device=device)
        pad[1, -length // 3:] = True
        with torch.no_grad():
            with torch.autocast(device.type, dtype=dtype):
                out = attn(x, key_padding_mask=pad)
            reference = attn(x, key_padding_mask=pad)
        real = ~pad
        results[f"module_{name}"] = {
            "finite": bool(torch.isfinite(out).all()), "dtype": str(out.dtype).replace("torch.", ""),
            "error_vs_float32": ((out.float() - reference)[real].abs().max() / reference[real].abs().max()).item(),
        }
        # the softmax itself: the same half-precision q, k, v into the module's kernel
        q, k, v = (torch.randn(3, heads, length, width // heads, generator=g) for _ in range(3))
        q = q * 12.0  # logits up to ~75
        q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
        allowed = ~pad[:, None, None, :]
        if attn.causal:
            allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=device).tril()
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
            got = attn._attend(q, k, v, allowed, is_causal=False)
        logits = q.double() @ k.double().transpose(-1, -2) / math.sqrt(width // heads)
        probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
        expected = probs @ v.double()
        rows = real[:, None, :, None].expand_as(expected)
        results[f"softmax_{name}"] = {
            "max_logit": round(logits.abs().max().item(), 1),
            "finite": bool(torch.isfinite(got).all()),
            "error": ((got.double() - expected)[rows].abs().max() / expected[rows].abs().max()).item(),
        }
    results["ok"] = all(v["finite"] for k, v in results.items() if isinstance(v, dict)) and all(
        v["error"] <= results["limit"] for k, v in results.items() if k.startswith("softmax_"))
    return results


def build_parser():
    # --json: this report (attention, training, ok), not tables
    p = benchmark_parser(__doc__.splitlines()[0], smoke=False, threads=False)
    p.set_defaults(device="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    p.add_argument("--updates", type=positive_int, default=100)
    p.add_argument("--batch", type=positive_int, default=64)
    p.add_argument("--length", type=positive_int, default=24)
    p.add_argument("--vocab", type=positive_int, default=64)
    p.add_argument("--width", type=positive_int, default=256)
    p.add_argument("--lr", type=positive_float, default=1e-3)
    p.add_argument("--warmup", type=non_negative_int, default=20)
    p.add_argument("--seed", type=non_negative_int, default=1)
    p.add_argument("--attention-length", type=positive_int, default=256, help="tokens in the attention check")
    p.add_check(heads_divide_width(heads=None, width="width"))
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    device, dtype = pick_device(args.device), DTYPES[args.dtype]
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available; use --device cpu for a smoke test", file=sys.stderr)
        return 2
    start_benchmark(args, device)
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "dtype": args.dtype}
    report["attention"] = {d: attention_check(device, DTYPES[d], args.attention_length) for d in sorted(DTYPES)}
    print(json_text.dumps(report["attention"], indent=1), flush=True)
    report["training"] = result = train(args, device, dtype)
    attention_ok = all(d["ok"] for d in report["attention"].values())
    ok = attention_ok and not result["nonfinite_losses"] and not result["skipped_steps"]
    report["ok"] = ok
    print(json_text.dumps({k: v for k, v in result.items()}, indent=1))
    print(f"{'OK' if ok else 'FAILED'}: {len(result['skipped_steps'])} skipped steps (gradient overflow),"
          f" {len(result['nonfinite_losses'])} non-finite losses, attention within half-precision"
          f" rounding: {attention_ok}", flush=True)
    if args.json:
        write_json(args.json, report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
