"""Extremely deep recursion: peak training memory and a short training run.

Builds the fairseq ``sret_transformer`` (LRC on) with ``--unique-layers`` layers per side,
each applied ``--recursions`` times: 5 unique layers x 100 recursions on the encoder and on
the decoder = 10 unique layers, 1000 layer applications. Training data are generated:
sentences of the reversal toy task (:mod:`fairseq_sret_cli.toy`), ``--length`` tokens each.

Memory (``--memory``): each setting (``--checkpoint-recursions`` off, then on) runs in a
fresh child process that builds the model, takes one warm-up training step (so Adam's
state exists), then measures the next steps (forward, backward, optimizer step) two ways:

- ``torch``: torch's own CPU allocator accounting (``torch.profiler`` with
  ``profile_memory=True`` reports every allocation and free); the peak of the running
  sum over the step = the largest amount of tensor memory the step adds on top of what
  lived before it (activations saved for backward, gradients, temporaries).
- ``rss``: the process's resident-set high-water mark (``VmHWM``, reset through
  ``/proc/self/clear_refs`` just before the step) minus the resident size before it
  (measured after ``malloc_trim`` hands the warm-up step's freed memory back to the OS)
  (a separate step without the profiler, whose event records would inflate it).

Training (``--updates N``): N Adam updates with gradient clipping, the loss of every
update printed; it exits non-zero unless every loss is finite and the last ten average
below the first ten.

Examples::

    OMP_NUM_THREADS=2 python -m benchmarks.deep_recursion --memory            # 1000 layers
    OMP_NUM_THREADS=2 python -m benchmarks.deep_recursion --updates 50 --checkpoint-recursions
    python -m benchmarks.deep_recursion --unique-layers 2 --recursions 5 --width 32 --updates 3
"""

import argparse
import itertools
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import (
    benchmark_parser, heads_divide_width, non_negative_float, non_negative_int, positive_float, positive_int,
    set_threads, start_benchmark, write_json,
)
from fairseq_sret_cli import toy
from fairseq_sret_cli.toy import reversal_batch, reversal_pairs
from fairseq_sret import json_text

REPO = Path(__file__).resolve().parents[1]


def build_parser():
    # --json: this report (config, memory, training), not tables
    p = benchmark_parser(__doc__.splitlines()[0], smoke=False, device=False)
    p.add_argument("--unique-layers", type=positive_int, default=5, help="unique layers per side")
    p.add_argument("--recursions", type=positive_int, default=100, help="applications of each layer")
    p.add_argument("--width", type=positive_int, default=256, help="embedding width (FFN = 4x, heads = width/64)")
    p.add_argument("--nll-ratio", type=non_negative_float, default=0.0,
                   help="NLL hidden ratio (NLLs are per-application parameters: 0.5 at width"
                        " 256 adds 66k parameters per application)")
    p.add_argument("--groups", default="1", help="--encoder-groups (one value: every recursion)")
    p.add_argument("--batch", type=positive_int, default=4, help="sentences per batch")
    p.add_argument("--length", type=positive_int, default=16, help="tokens per sentence")
    p.add_argument("--vocab", type=positive_int, default=16, help="generated symbols")
    p.add_argument("--lr", type=positive_float, default=3e-4)
    p.add_argument("--seed", type=non_negative_int, default=1)
    p.add_argument("--checkpoint-recursions", action="store_true", help="train with activation checkpointing")
    p.add_argument("--updates", type=non_negative_int, default=0, help="train this many updates")
    p.add_argument("--time-limit", type=non_negative_float, default=0.0,
                   help="stop training after this many seconds (0 = no limit); reported honestly")
    p.add_argument("--memory", action="store_true", help="measure peak step memory with and without checkpointing")
    p.add_argument("--child-memory", action="store_true", help=argparse.SUPPRESS)
    p.add_check(heads_divide_width(heads=None, width="width"))
    return p


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def build_model(args, checkpoint: bool):
    """The fairseq sret_transformer for ``args``, and its dictionary."""
    task = toy.ToyTask(args.vocab)
    heads = max(1, args.width // 64)
    model = toy.build_model(
        "sret_transformer_tiny", task=task,
        encoder_embed_dim=args.width, decoder_embed_dim=args.width,
        encoder_ffn_embed_dim=4 * args.width, decoder_ffn_embed_dim=4 * args.width,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_layers=args.unique_layers, decoder_layers=args.unique_layers,
        encoder_recursions=args.recursions, decoder_recursions=args.recursions,
        encoder_groups=args.groups, nll_ratio=args.nll_ratio, no_lrc=False,
        share_all_embeddings=True, dropout=0.0, checkpoint_recursions=checkpoint,
    )
    return model, task.source_dictionary


def sentence_pairs(args, seed):
    """Endless reversal pairs of ``--length - 1`` words (plus EOS: ``--length`` tokens)."""
    return reversal_pairs(seed, vocab_size=args.vocab, lengths=(args.length - 1, args.length - 1))


def make_batch(d, args, pairs):
    """src = w_1 .. w_n </s>, target = w_n .. w_1 </s>, prev = </s> w_n .. w_1 (teacher forcing)."""
    chosen = list(itertools.islice(pairs, args.batch))
    return reversal_batch(chosen, first_word=d.nspecial, pad=d.pad(), eos=d.eos())


def train_step(model, optimizer, batch):
    src, lengths, prev, target = batch
    logits, _ = model(src, lengths, prev)
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), target.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------ memory
def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _malloc_trim() -> None:
    """Give the memory glibc keeps after the warm-up step back to the OS, so that the
    resident size before the measured step holds live data only."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _profiler_peak_bytes(prof) -> int:
    """Peak of the running sum of allocations minus frees reported by torch's CPU allocator."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for e in events:
        current += e.nbytes()  # > 0: allocation, < 0: free
        peak = max(peak, current)
    return peak


def measure_child(args) -> dict:
    """One setting in this (fresh) process: warm-up step, then the measured step."""
    torch.manual_seed(args.seed)
    model, d = build_model(args, args.checkpoint_recursions)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    pairs = sentence_pairs(args, args.seed)
    start = time.time()
    train_step(model, optimizer, make_batch(d, args, pairs))
    warmup_s = time.time() - start
    result = {"checkpoint_recursions": args.checkpoint_recursions, "parameters": n_params(model),
              "step_seconds_warmup": round(warmup_s, 1)}
    try:
        batch = make_batch(d, args, pairs)
        _malloc_trim()
        rss_before = _rss_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM (Linux >= 4.0)
        train_step(model, optimizer, batch)
        result["rss_before_mib"] = round(rss_before / 1024, 1)
        result["rss_peak_mib"] = round(_rss_kib("VmHWM") / 1024, 1)
        result["rss_step_growth_mib"] = round(result["rss_peak_mib"] - result["rss_before_mib"], 1)
    except OSError:  # not Linux: no resettable high-water mark
        pass
    from torch.profiler import ProfilerActivity, profile

    batch = make_batch(d, args, pairs)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step(model, optimizer, batch)
    result["torch_step_peak_mib"] = round(_profiler_peak_bytes(prof) / 2**20, 1)
    params_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    result["parameters_mib"] = round(params_mib, 1)
    return result


def measure_memory(args) -> list:
    results = []
    for checkpoint in (False, True):
        cmd = [sys.executable, "-m", "benchmarks.deep_recursion", "--child-memory", *_forward_args(args)]
        if checkpoint:
            cmd.append("--checkpoint-recursions")
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"memory child failed:\n{out.stderr[-3000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"checkpoint_recursions={checkpoint}: {result}", flush=True)
        results.append(result)
    return results


def _forward_args(args) -> list:
    return [
        "--unique-layers", str(args.unique_layers), "--recursions", str(args.recursions),
        "--width", str(args.width), "--nll-ratio", str(args.nll_ratio), "--groups", args.groups,
        "--batch", str(args.batch), "--length", str(args.length), "--vocab", str(args.vocab),
        "--lr", str(args.lr), "--seed", str(args.seed), *(["--threads", str(args.threads)] if args.threads else []),
    ]


# ------------------------------------------------------------------ training
def train(args) -> dict:
    torch.manual_seed(args.seed)
    model, d = build_model(args, args.checkpoint_recursions)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98))
    pairs = sentence_pairs(args, args.seed + 1)
    losses, start = [], time.time()
    print(f"training {args.updates} updates: {2 * args.unique_layers * args.recursions} layer"
          f" applications, {n_params(model):,} parameters", flush=True)
    for update in range(1, args.updates + 1):
        losses.append(train_step(model, optimizer, make_batch(d, args, pairs)))
        elapsed = time.time() - start
        print(f"update {update:4d}  loss {losses[-1]:.4f}  {elapsed:7.1f}s", flush=True)
        if args.time_limit and elapsed > args.time_limit and update < args.updates:
            print(f"time limit {args.time_limit:.0f}s reached after {update} updates", flush=True)
            break
    k = max(1, min(10, len(losses) // 2))
    finite = all(math.isfinite(v) for v in losses)
    falling = sum(losses[-k:]) / k < sum(losses[:k]) / k
    return {"updates": len(losses), "losses": [round(v, 4) for v in losses], "seconds": round(time.time() - start, 1),
            "finite": finite, "falling": falling, "first_mean": sum(losses[:k]) / k, "last_mean": sum(losses[-k:]) / k}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child_memory:  # the last line of its output is its result
        set_threads(args.threads)
        print(json_text.dumps(measure_child(args)))
        return 0
    start_benchmark(args, torch.device("cpu"))
    report = {"config": vars(args), "layer_applications": 2 * args.unique_layers * args.recursions,
              "torch_threads": torch.get_num_threads()}
    if args.memory:
        report["memory"] = measure_memory(args)
    ok = True
    if args.updates:
        report["training"] = result = train(args)
        ok = result["finite"] and result["falling"]
        print(f"finite: {result['finite']}, falling: {result['falling']}"
              f" (mean of first {min(10, len(result['losses']) // 2 or 1)} {result['first_mean']:.4f}"
              f" -> last {result['last_mean']:.4f})", flush=True)
    if args.json:
        write_json(args.json, report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
