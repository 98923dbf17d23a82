"""Translation on the CPU in fp32 and in bf16 (``--bf16``), and decoding in int8, in one process.

    python -m benchmarks.bench_cpu_bf16 --threads 1            # the quick start's model
    python -m benchmarks.bench_cpu_bf16 --threads 1 --int8     # + int8 decoding (the int8 extra)
    python -m benchmarks.bench_cpu_bf16 --smoke                # harness check (CI)

The quick start's architecture (``sret_transformer_tiny``, ``--share-all-embeddings``) with
random weights and the Multi30k quick start's joined dictionary size (7,796 entries) on
synthetic left-padded batches. Decoding goes the way ``fairseq-generate --cpu [--bf16]``
goes: the model is prepared with ``prepare_for_inference_(cfg)`` and decoded by
``task.inference_step`` (:mod:`fairseq_sret.fairseq_patches` makes ``prepare_for_inference_``
cast the model to bf16 for ``--bf16``, as fairseq casts it to fp16 for ``--fp16``), beam ``--beam``, every hypothesis forced to
``--tgt-len`` tokens so every precision decodes the same steps. With ``--int8`` the linear
layers are also quantized the way ``--model-overrides "{'int8_in_generation': True}"`` does it
(:mod:`fairseq_sret.core.int8`, through the model's ``prepare_for_inference_``). Training: one update
(forward, label-smoothed loss, backward, Adam) in fp32 and under CPU bf16 autocast with
fp32 weights, which is what ``fairseq-train --cpu --bf16`` runs.

Variants are timed round-robin (fp32, bf16, [int8,] fp32, ...) by this process's CPU time
with one thread (wall time otherwise); printed: median and spread (min-max) over rounds and
each variant's ratio to fp32 in each round.
"""

import copy
import statistics

import torch
import torch.nn.functional as F

from .common import (
    benchmark_parser, positive_int, program,
    clock_note, default_clock, finish_benchmark, measure, prepare_as_generate, print_table,
    quiet_logging, start_benchmark,
)


def build_parser():
    p = benchmark_parser(__doc__, smoke="tiny model, one round (CI harness check)", device=False)
    p.set_defaults(threads=1)
    p.add_argument("--arch", default="sret_transformer_tiny")
    p.add_argument("--dict-size", type=positive_int, default=7796, help="joined dictionary entries, specials included")
    p.add_argument("--gen-batch", type=positive_int, default=16, help="sentences per generation batch")
    p.add_argument("--src-len", type=positive_int, default=20, help="longest source (tokens, incl. EOS)")
    p.add_argument("--tgt-len", type=positive_int, default=20, help="generated length; longest training target")
    p.add_argument("--train-batch", type=positive_int, default=64, help="sentence pairs per training update")
    p.add_argument("--beam", type=positive_int, default=5)
    p.add_argument("--iters", type=positive_int, default=3, help="calls per variant per round")
    p.add_argument("--rounds", type=positive_int, default=5)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--int8", action="store_true",
                   help="also decode with int8 linear layers (torchao, the int8 extra; decoding only)")
    return p


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    args.overrides = {}
    if args.smoke:
        args.dict_size, args.gen_batch, args.src_len, args.tgt_len, args.train_batch = 100, 2, 6, 5, 4
        args.iters, args.rounds, args.beam = 1, 1, 2
        args.overrides = dict(encoder_embed_dim=32, decoder_embed_dim=32, encoder_ffn_embed_dim=64,
                              decoder_ffn_embed_dim=64, encoder_attention_heads=2, decoder_attention_heads=2)
    return args


def synthetic_batch(dictionary, batch, src_len, tgt_len, seed=0):
    """Left-padded sources, right-padded targets and their prev_output_tokens."""
    g = torch.Generator().manual_seed(seed)
    pad, eos = dictionary.pad(), dictionary.eos()
    src = torch.full((batch, src_len), pad, dtype=torch.long)
    target = torch.full((batch, tgt_len), pad, dtype=torch.long)
    prev = torch.full((batch, tgt_len), pad, dtype=torch.long)
    src_lengths = torch.randint(max(2, src_len // 2), src_len + 1, (batch,), generator=g)
    tgt_lengths = torch.randint(max(2, tgt_len // 2), tgt_len + 1, (batch,), generator=g)
    for i, (s, t) in enumerate(zip(src_lengths.tolist(), tgt_lengths.tolist())):
        words = torch.randint(dictionary.nspecial, len(dictionary), (s - 1,), generator=g)
        src[i, src_len - s:] = torch.cat([words, torch.tensor([eos])])
        out = torch.randint(dictionary.nspecial, len(dictionary), (t - 1,), generator=g)
        target[i, :t] = torch.cat([out, torch.tensor([eos])])
        prev[i, :t] = torch.cat([torch.tensor([eos]), out])
    return {"net_input": {"src_tokens": src, "src_lengths": src_lengths, "prev_output_tokens": prev},
            "target": target, "ntokens": int(tgt_lengths.sum())}


def decode_fn(model, dictionary, sample, beam, length, precision):
    """Beam search of a copy of ``model`` prepared as fairseq-generate does: ``fp32``, ``bf16``
    (``--bf16``) or ``int8`` (``--model-overrides "{'int8_in_generation': True}"``)."""
    from fairseq.sequence_generator import SequenceGenerator
    from fairseq.tasks.fairseq_task import FairseqTask

    model = copy.deepcopy(model).eval()
    model.args.int8_in_generation = precision == "int8"
    prepare_as_generate(model, beam, precision == "bf16")
    if precision == "int8":
        from fairseq_sret.core.int8 import is_int8

        if not any(is_int8(m) for m in model.modules()):
            raise RuntimeError("int8_in_generation quantized no linear layer: the int8 row would time fp32")
    generator = SequenceGenerator([model], dictionary, beam_size=beam, max_len_a=0, max_len_b=length,
                                  min_len=length)
    source = {"net_input": {k: sample["net_input"][k] for k in ("src_tokens", "src_lengths")}}

    def decode():
        return FairseqTask.inference_step(None, generator, [model], source)

    return decode


def train_fn(model, sample, pad, bf16):
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5, betas=(0.9, 0.98))

    def step():
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits, _ = model(**sample["net_input"])
            lprobs = F.log_softmax(logits.float(), dim=-1)
            loss = F.nll_loss(lprobs.view(-1, lprobs.size(-1)), sample["target"].view(-1), ignore_index=pad,
                              reduction="sum")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def report(title, times, work, unit):
    rates = {name: [work / t for t in ts] for name, ts in times.items()}
    print_table(title, ["precision", f"{unit} (median)", "spread over rounds"],
                [[name, f"{statistics.median(values):.1f}", f"{min(values):.1f}-{max(values):.1f}"]
                 for name, values in rates.items()])
    for name in rates:
        if name != "fp32":
            ratios = [b / a for a, b in zip(rates["fp32"], rates[name])]
            print(f"{name}/fp32 per round: {' '.join(f'{r:.2f}' for r in ratios)};"
                  f" median {statistics.median(ratios):.2f}x")


def main(argv=None):
    args = parse_args(argv)
    quiet_logging()
    import fairseq_sret.models  # noqa: F401  (the fairseq patches: --bf16 on the CPU)
    from fairseq_sret.fairseq_patches import CPUBF16Unsupported, check_cpu_bf16
    from fairseq_sret_cli.toy import ToyTask, build_model

    try:  # what --bf16 itself refuses on this processor: nothing to measure
        check_cpu_bf16()
    except CPUBF16Unsupported as exc:
        raise SystemExit(f"{program()}: error: {exc}")
    if args.int8:
        from fairseq_sret.core.int8 import int8_config
        from fairseq_sret.extras import MissingExtraError

        try:
            int8_config()
        except MissingExtraError as exc:
            raise SystemExit(f"{program()}: error: --int8: {exc}")
    device = start_benchmark(args, torch.device("cpu"))
    clock = default_clock(device)
    print(f"native bf16 (AMX-BF16 or AVX512-BF16): True; timing: {clock_note(clock)}")
    task = ToyTask.of_dictionary_size(args.dict_size)
    dictionary = task.target_dictionary
    torch.manual_seed(0)
    model = build_model(args.arch, task=task, share_all_embeddings=True, **args.overrides)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.arch}: {params / 1e6:.2f}M parameters, dictionary {len(dictionary)}")

    sample = synthetic_batch(dictionary, args.gen_batch, args.src_len, args.tgt_len)
    precisions = ("fp32", "bf16", "int8") if args.int8 else ("fp32", "bf16")
    fns = {name: decode_fn(model, dictionary, sample, args.beam, args.tgt_len, name) for name in precisions}
    times = measure(fns, device, 1, args.iters, args.rounds, clock)
    report(f"beam {args.beam} decoding, {args.gen_batch} sentences a batch, {args.tgt_len} tokens each",
           times, args.gen_batch, "sentences/s")

    if not args.skip_train:
        train = synthetic_batch(dictionary, args.train_batch, args.src_len, args.tgt_len, seed=1)
        fns = {name: train_fn(model, train, dictionary.pad(), name == "bf16") for name in ("fp32", "bf16")}
        times = measure(fns, device, 1, args.iters, args.rounds, clock)
        report(f"training update, {args.train_batch} sentence pairs ({train['ntokens']} target tokens)",
               times, train["ntokens"], "target tokens/s")
    finish_benchmark(args)


if __name__ == "__main__":
    main()
