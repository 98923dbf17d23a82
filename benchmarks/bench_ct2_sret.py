"""SReT unrolled into CTranslate2 (``sret-export-ct2``'s conversion) against fairseq, on the CPU,
at the quick start's architecture (``sret_transformer_tiny``: 2 unique layers x 2 recursions per
side, width 256, a joint 8K vocabulary) with random weights and LRC coefficients drawn around 1,
with the NLLs (ratio 0.5) and without them (ratio 0) (docs/benchmarks/translation.md).

    python -m benchmarks.bench_ct2_sret [--threads 1] [--rounds 3] [--sentences 256] [--smoke] [--json PATH]

Per model: the converted folder's size (fp32, int8, fp32 at depth 1) beside the checkpoint's
fp32 weights, the LayerNorm epsilons the fold asks for (CTranslate2 holds one), the largest
teacher-forced log-probability difference from fairseq, and beam-5 decoding of ``--sentences``
random sources (8 to 20 tokens) in batches of 64, every hypothesis forced to 20 tokens (random
weights end nowhere): sentences per second of the process's CPU time, fairseq's
SequenceGenerator (the model LRC-folded, as fairseq-generate prepares it) and CTranslate2 fp32,
int8 and fp32 at depth 1, measured round-robin ``--rounds`` times (median). One thread is the
comparison: CTranslate2's own threads are ``intra_threads=--threads``.
"""

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import benchmark_parser, finish_benchmark, positive_int, print_table, start_benchmark

LENGTH, BEAM, BATCH = 20, 5, 64


def build_parser():
    p = benchmark_parser(__doc__, device=False)
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--sentences", type=positive_int, default=256)
    return p


def random_model(nll_ratio: float, vocab_size: int):
    """``sret_transformer_tiny`` with random weights and LRC coefficients drawn around 1."""
    from fairseq_sret_cli.toy import build_model

    torch.manual_seed(0)
    model = build_model("sret_transformer_tiny", vocab_size=vocab_size, share_all_embeddings=True, dropout=0.0,
                        nll_ratio=nll_ratio).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("skip_scale", "branch_scale")):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def fairseq_decoder(model, dictionary, sources):
    from fairseq.sequence_generator import SequenceGenerator
    from fairseq_sret.core import fold_lrc

    generator = SequenceGenerator([fold_lrc(model)], dictionary, beam_size=BEAM, max_len_b=LENGTH, min_len=LENGTH)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    batches = []
    for first in range(0, len(order), BATCH):
        batch = [sources[i] for i in order[first:first + BATCH]]
        width = max(len(s) for s in batch) + 1
        src = torch.full((len(batch), width), dictionary.pad())
        for i, s in enumerate(batch):
            ids = [dictionary.index(w) for w in s] + [dictionary.eos()]
            src[i, width - len(ids):] = torch.tensor(ids)
        batches.append({"net_input": {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1)}})

    def run():
        with torch.inference_mode():
            for sample in batches:
                generator.forward(sample)
    return run


def ct2_decoder(translator, sources):
    def run():
        translator.translate_batch(sources, beam_size=BEAM, max_batch_size=BATCH, min_decoding_length=LENGTH,
                                   max_decoding_length=LENGTH)
    return run


def teacher_forced_difference(model, translator, dictionary, sources) -> float:
    """Largest |log p| difference over ``sources`` scored with themselves as targets."""
    batch = sources[:16]
    width = max(len(s) for s in batch) + 1
    src = torch.full((len(batch), width), dictionary.pad())
    prev = torch.full((len(batch), width), dictionary.pad())
    for i, s in enumerate(batch):
        ids = [dictionary.index(w) for w in s] + [dictionary.eos()]
        src[i, width - len(ids):] = torch.tensor(ids)
        prev[i, :len(ids)] = torch.tensor([dictionary.eos()] + ids[:-1])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(src, src.ne(dictionary.pad()).sum(1), prev)[0].double(), -1)
    worst = 0.0
    for i, result in enumerate(translator.score_batch(batch, batch)):
        ids = torch.tensor([dictionary.index(w) for w in batch[i]] + [dictionary.eos()])
        ref = log_probs[i, torch.arange(len(ids)), ids]
        worst = max(worst, (torch.tensor(result.log_probs, dtype=torch.float64) - ref).abs().max().item())
    return worst


def main(argv=None):
    args = build_parser().parse_args(argv)
    start_benchmark(args, torch.device("cpu"))
    import ctranslate2

    from fairseq_sret.conversion.ctranslate2_spec import converter

    vocab_size = 200 if args.smoke else 8000
    sentences, rounds = (16, 1) if args.smoke else (args.sentences, args.rounds)
    threads = args.threads or 1
    torch.set_num_threads(threads)
    size_rows, speed_rows, results = [], [], []
    with tempfile.TemporaryDirectory(prefix="ct2-sret-") as tmp:
        for nll_ratio in (0.5, 0.0):
            model = random_model(nll_ratio, vocab_size)
            dictionary = model.encoder.dictionary
            words = [dictionary[i] for i in range(dictionary.nspecial, len(dictionary))]
            rng = random.Random(0)
            sources = [[rng.choice(words) for _ in range(rng.randint(8, 20))] for _ in range(sentences)]
            label = f"NLL ratio {nll_ratio}"
            engines = {"fairseq fp32": fairseq_decoder(model, dictionary, sources)}
            for name, quantization, depth in (("CTranslate2 fp32", None, None), ("CTranslate2 int8", "int8", None),
                                              ("CTranslate2 fp32, depth 1", None, 1)):
                folder = Path(tmp) / f"{nll_ratio}-{name.replace(' ', '_').replace(',', '')}"
                if depth:
                    model.set_depth(depth, depth)
                made = converter(model, dictionary.symbols, dictionary.symbols)
                made.convert(str(folder), quantization=quantization)
                model.set_depth(None, None)
                translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=threads, inter_threads=1,
                                                    compute_type=quantization or "float32")
                engines[name] = ct2_decoder(translator, sources)
                built = made.built
                difference = (teacher_forced_difference(model, translator, dictionary, sources)
                              if quantization is None and depth is None else None)
                size_rows.append([label, name, f"{(folder / 'model.bin').stat().st_size / 1e6:.1f}",
                                  f"{built.layers[0]}+{built.layers[1]}", f"{built.epsilon_spread:.3g}",
                                  "-" if difference is None else f"{difference:.1e}"])
            unique = {v.data_ptr(): v for v in model.state_dict().values() if v.is_floating_point()}  # tied once
            weights = sum(v.numel() * 4 for v in unique.values()) / 1e6
            size_rows.append([label, "checkpoint's fp32 weights", f"{weights:.1f}", "", "", ""])
            seconds = {name: [] for name in engines}
            for _ in range(rounds):
                for name, run in engines.items():
                    start = time.process_time()
                    run()
                    seconds[name].append(time.process_time() - start)
            base = statistics.median(seconds["fairseq fp32"])
            for name, values in seconds.items():
                rate = sentences / statistics.median(values)
                speed_rows.append([label, name, f"{rate:.1f}", f"{base / statistics.median(values):.2f}x"])
                results.append({"model": label, "engine": name, "sentences_per_cpu_s": round(rate, 2)})
    print_table("converted folders", ["model", "export", "MB", "CTranslate2 layers (enc+dec)",
                                      "epsilons asked, largest / smallest", "teacher-forced max |d log p|"], size_rows)
    print_table(f"beam {BEAM}, {LENGTH} tokens forced, batches of {BATCH}, {threads} thread(s), median of {rounds}",
                ["model", "engine", "sentences per CPU second", "against fairseq"], speed_rows)
    finish_benchmark(args, rows=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
