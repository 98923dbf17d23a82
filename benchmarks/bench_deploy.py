"""Deploying a trained translation model on the CPU: BLEU and sentences/s of SReT's paths
(fairseq's beam search in fp32, bf16 and int8) beside a fairseq transformer in fairseq and
in CTranslate2 (fp32 and int8), on one test set, one thread and more (docs/benchmarks/translation.md, "Deployment on the CPU").

    pip install ctranslate2        # the CTranslate2 rows; the int8 rows need the int8 extra
    python -m benchmarks.bench_deploy --data-bin DATA_BIN --sret SRET.pt --transformer TRANSFORMER.pt \\
        [--subsets test test1] [--threads 1 2] [--batch-size 64] [--beam 5] [--rows ...] [--limit N] \\
        [--repeats 3]

Every row translates the whole subset (or its first ``--limit`` sentences) with beam
``--beam``, at most 200 tokens, batches of ``--batch-size`` sentences that each engine forms
itself from the length-sorted set (fairseq's batch iterator; CTranslate2's
``translate_batch(max_batch_size=...)``). Scored with sacreBLEU (13a) against the raw
references ``text/<subset>.raw.<tgt>`` of the data-bin, after SentencePiece's pieces are
joined as fairseq's ``--post-process sentencepiece`` does. Speed, of the translation alone
(model loading and conversion excluded): sentences per wall-clock second, which counts more
than one thread (run it on an otherwise idle machine), and per second of the process's CPU
time, which a busy neighbour changes little with one thread. With ``--repeats N`` every row
translates each subset N times in its process: the speed is the median of the N, with their
range; BLEU and the hypotheses are the first pass's. ``output_words``, the words of the
hypotheses, tells models that stop early from models that ramble.

Parity: every ``ctranslate2`` row of a model is compared with the ``fairseq`` fp32 row of the
same model at the same depth (measured in the same command, the same thread count if it ran
with it): how many of its hypotheses are identical, and the BLEU difference.

Rows (``--rows``; default all that can run here):
- ``sret/fairseq/fp32|bf16|int8``: the SReT checkpoint through fairseq's SequenceGenerator,
  prepared as fairseq-generate prepares it; ``bf16`` is fairseq-generate's ``--bf16`` on the
  CPU, ``int8`` its ``--model-overrides "{'int8_in_generation': True}"``.
  ``sret/fairseq-depth1/fp32``: the same at depth 1 (``--model-overrides
  "{'encoder_depth': 1, 'decoder_depth': 1}"``).
- ``sret/pipeline/fp32|int8``: the SReT checkpoint exported (``sret-export-hf``'s function) and
  run by transformers' ``pipeline("sret-translation")`` on the raw source text, batches of
  ``--batch-size`` in its length order; ``int8`` loads the export with
  ``TorchAoConfig(int8_config())``. ``sret/pipeline-given-order/fp32``: transformers' own
  batching of the texts in file order (what the pipeline did before it sorted).
- ``transformer/fairseq/fp32``: the transformer checkpoint the same way.
- ``transformer/ctranslate2/fp32|int8``: the transformer converted with CTranslate2's own
  fairseq converter, run with ``compute_type`` fp32 or int8.
- ``sret/ctranslate2/fp32|int8``: the SReT checkpoint converted as ``sret-export-ct2`` converts
  it (every application of a shared layer one CTranslate2 layer, every NLL one more, the LRC
  folded; fp32 weights), run with ``compute_type`` fp32 or int8; ``sret/ctranslate2-depth1/...``
  the same at depth 1 (by default only for a checkpoint trained with ``--mixed-depth``).
"""

import functools
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import (
    benchmark_parser, finish_benchmark, finite_float, positive_int, print_table, quiet_logging, start_benchmark, thread_count,
)
from fairseq_sret import json_text

ROWS = ("sret/fairseq/fp32", "sret/fairseq/bf16", "sret/fairseq/int8", "sret/pipeline/fp32", "sret/pipeline/int8",
        "sret/pipeline-given-order/fp32", "transformer/fairseq/fp32", "transformer/ctranslate2/fp32",
        "transformer/ctranslate2/int8", "sret/ctranslate2/fp32", "sret/ctranslate2/int8",
        "sret/ctranslate2-depth1/fp32", "sret/ctranslate2-depth1/int8", "sret/fairseq-depth1/fp32")

#: our precision names -> CTranslate2's compute types
CT2_COMPUTE_TYPES = {"fp32": "float32", "int8": "int8"}


def build_parser():
    # CPU only; --threads is its own: the thread counts to measure, each row in a fresh process
    p = benchmark_parser(__doc__, smoke=False, device=False, threads=False)
    p.add_argument("--data-bin", required=True, type=Path)
    p.add_argument("--sret", type=Path, help="a trained sret_transformer checkpoint")
    p.add_argument("--transformer", type=Path, help="a trained fairseq transformer checkpoint, same data-bin")
    p.add_argument("--subsets", nargs="+", default=["test"])
    p.add_argument("--threads", nargs="+", type=thread_count, default=[1], dest="thread_counts", metavar="N",
                   help="measure every row with each of these thread counts")
    p.add_argument("--rows", nargs="+", choices=ROWS, help="default: every row whose checkpoint is given")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--beam", type=positive_int, default=5)
    p.add_argument("--lenpen", type=finite_float, default=1.0)
    p.add_argument("--limit", type=positive_int, help="translate only the first N sentences of each subset")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="translate each subset this many times per row: speed is their median (default 1)")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    given = {"sret": args.sret, "transformer": args.transformer}
    args.rows = args.rows or [row for row in ROWS if given[row.split("/")[0]] is not None
                              and ("depth1" not in row or trained_mixed_depth(args.sret))]
    for row in args.rows:
        if given[row.split("/")[0]] is None:
            p.error(f"row {row} needs --{row.split('/')[0]}")
    if not args.rows:
        p.error("give --sret and/or --transformer")
    return args


def trained_mixed_depth(checkpoint) -> bool:
    """Whether the checkpoint's training criterion had ``--mixed-depth`` terms."""
    from fairseq_sret.checkpoints import load_checkpoint

    criterion = (load_checkpoint(checkpoint).get("cfg") or {}).get("criterion") or {}
    return bool(criterion.get("mixed_depth") if isinstance(criterion, dict) else getattr(criterion, "mixed_depth", None))


class Seconds(tuple):
    """(wall-clock, process CPU) seconds; they add and subtract pairwise."""

    def __new__(cls, wall=0.0, cpu=0.0):
        return super().__new__(cls, (wall, cpu))

    def __add__(self, other):
        return Seconds(self[0] + other[0], self[1] + other[1])

    def __sub__(self, other):
        return Seconds(self[0] - other[0], self[1] - other[1])


def clock() -> Seconds:
    return Seconds(time.perf_counter(), time.process_time())


def join_pieces(pieces: str) -> str:
    """fairseq's ``--post-process sentencepiece``."""
    return pieces.replace(" ", "").replace("\u2581", " ").strip()


class FairseqEngine:
    """A checkpoint through fairseq's SequenceGenerator, prepared as fairseq-generate does."""

    def __init__(self, checkpoint, data_bin, precision, beam, lenpen, depth=None):
        import fairseq_sret.models  # noqa: F401  (registers sret_transformer)
        from fairseq import checkpoint_utils
        from fairseq.sequence_generator import SequenceGenerator

        from benchmarks.common import prepare_as_generate

        overrides = {"data": str(data_bin)}
        if precision == "int8":
            overrides["int8_in_generation"] = True
        if depth is not None:
            overrides.update(encoder_depth=depth, decoder_depth=depth)
        models, _, self.task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides=overrides)
        self.model = models[0]
        prepare_as_generate(self.model, beam, bf16=precision == "bf16")
        self.generator = SequenceGenerator([self.model], self.task.target_dictionary, beam_size=beam,
                                           len_penalty=lenpen, max_len_b=200)

    def translate(self, subset, batch_size, limit):
        """fairseq's batches (its length order, ``batch_size`` sentences each) of the first
        ``limit`` sentences (all: None)."""
        task = self.task
        task.load_dataset(subset)
        dataset = task.dataset(subset)
        count = min(limit or len(dataset), len(dataset))
        order = [int(i) for i in dataset.ordered_indices() if i < count]
        hypotheses, seconds = {}, Seconds()
        with torch.inference_mode():
            for first in range(0, count, batch_size):
                sample = dataset.collater([dataset[i] for i in order[first:first + batch_size]])
                net_input = {k: v for k, v in sample["net_input"].items() if k != "prev_output_tokens"}
                start = clock()
                hypos = self.generator.forward({"net_input": net_input})
                seconds += clock() - start
                for sentence_id, hypo in zip(sample["id"].tolist(), hypos):
                    hypotheses[sentence_id] = join_pieces(task.target_dictionary.string(hypo[0]["tokens"].int()))
        return [hypotheses[i] for i in range(count)], seconds


class PipelineEngine:
    """The SReT checkpoint exported to transformers, translated by the sret-translation
    pipeline (beam and lengths from the export's generation settings: fairseq-generate's)."""

    def __init__(self, checkpoint, data_bin, precision, given_order):
        import fairseq_sret.hf  # noqa: F401  (registers the model and the pipeline task)
        from fairseq_sret.hf.convert import export_checkpoint
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

        self._export = tempfile.TemporaryDirectory(prefix="sret-hf-")  # removed with the engine
        folder = self._export.name
        export_checkpoint(checkpoint, data_bin, folder)
        options = {}
        if precision == "int8":
            from fairseq_sret.core.int8 import int8_config
            from transformers import TorchAoConfig

            options["quantization_config"] = TorchAoConfig(int8_config())
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, **options).eval()
        self.pipeline = pipeline("sret-translation", model=model, tokenizer=AutoTokenizer.from_pretrained(folder))
        self.data_bin, self.given_order = Path(data_bin), given_order

    def translate(self, subset, batch_size, limit):
        from transformers import Pipeline

        lines = subset_lines(self.data_bin, subset, "raw", "source_lang", limit)
        call = functools.partial(Pipeline.__call__, self.pipeline) if self.given_order else self.pipeline
        start = clock()
        with torch.inference_mode():
            results = call(lines, batch_size=batch_size)
        seconds = clock() - start
        return [r[0]["translation_text"] for r in results], seconds


class CTranslate2Engine:
    """A fairseq transformer converted by CTranslate2's fairseq converter, or (``sret_depth``
    given: None for every trained application, else the depth) an SReT checkpoint converted as
    ``sret-export-ct2`` converts it; fp32, into a temporary folder removed with the engine,
    quantized at load by ``compute_type``."""

    def __init__(self, checkpoint, data_bin, compute_type, beam, lenpen, threads, sret=False, sret_depth=None):
        import ctranslate2

        self._converted = tempfile.TemporaryDirectory(prefix="ct2-")
        if sret:
            from fairseq_sret.conversion.ctranslate2_spec import converter
            from fairseq_sret_cli.export_ct2 import load_model

            model, task = load_model(Path(checkpoint), Path(data_bin))
            if sret_depth is not None:
                model.set_depth(sret_depth, sret_depth)
            converter(model, task.source_dictionary.symbols, task.target_dictionary.symbols).convert(
                self._converted.name, force=True)
        else:
            from ctranslate2.converters import FairseqConverter

            FairseqConverter(str(checkpoint), str(data_bin),
                             user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_sret"),
                             unsafe_deserialization=True).convert(self._converted.name, force=True)
        self.translator = ctranslate2.Translator(self._converted.name, device="cpu",
                                                 compute_type=CT2_COMPUTE_TYPES[compute_type],
                                                 intra_threads=threads, inter_threads=1)
        self.data_bin, self.beam, self.lenpen = Path(data_bin), beam, lenpen

    def translate(self, subset, batch_size, limit):
        lines = subset_lines(self.data_bin, subset, "sp", "source_lang", limit)
        start = clock()
        results = self.translator.translate_batch([line.split() for line in lines], beam_size=self.beam,
                                                  length_penalty=self.lenpen, max_batch_size=batch_size,
                                                  max_decoding_length=200)
        seconds = clock() - start
        return [join_pieces(" ".join(r.hypotheses[0])) for r in results], seconds


def subset_lines(data_bin: Path, subset: str, kind: str, side: str, limit):
    """The first ``limit`` lines (all: None) of the data-bin's ``text/SUBSET.KIND.LANG``, LANG
    its metadata's ``side`` (``source_lang``, ``target_lang``)."""
    from fairseq_sret_cli.data.common import read_metadata
    from fairseq_sret_cli.data.io import read_lines

    lines = read_lines(Path(data_bin) / "text" / f"{subset}.{kind}.{read_metadata(data_bin)[side]}")
    return lines[:limit] if limit else lines


def run_row(row, args, threads):
    model, engine, precision = row.split("/")
    checkpoint = args.sret if model == "sret" else args.transformer
    torch.set_num_threads(threads)
    if engine.startswith("ctranslate2"):
        translator = CTranslate2Engine(checkpoint, args.data_bin, precision, args.beam, args.lenpen, threads,
                                       sret=model == "sret", sret_depth=1 if engine.endswith("depth1") else None)
    elif engine.startswith("pipeline"):
        translator = PipelineEngine(checkpoint, args.data_bin, precision, given_order=engine.endswith("given-order"))
    else:
        translator = FairseqEngine(checkpoint, args.data_bin, precision, args.beam, args.lenpen,
                                   depth=1 if engine.endswith("depth1") else None)
    from fairseq_sret_cli.evaluation.bleu import sacrebleu_detok

    results = []
    for subset in args.subsets:
        passes = [translator.translate(subset, args.batch_size, args.limit) for _ in range(args.repeats)]
        hyps = passes[0][0]
        bleu = sacrebleu_detok(hyps, subset_lines(args.data_bin, subset, "raw", "target_lang", args.limit))
        per_s = sorted(len(hyps) / wall for _, (wall, _) in passes)
        per_cpu_s = sorted(len(hyps) / cpu for _, (_, cpu) in passes)
        results.append({"row": row, "threads": threads, "subset": subset, "sentences": len(hyps),
                        "bleu": round(bleu.score, 4), "repeats": args.repeats,
                        "seconds": [round(wall, 2) for _, (wall, _) in passes],
                        "cpu_seconds": [round(cpu, 2) for _, (_, cpu) in passes],
                        "sentences_per_s": round(statistics.median(per_s), 2),
                        "sentences_per_s_range": [round(per_s[0], 2), round(per_s[-1], 2)],
                        "sentences_per_cpu_s": round(statistics.median(per_cpu_s), 2),
                        "sentences_per_cpu_s_range": [round(per_cpu_s[0], 2), round(per_cpu_s[-1], 2)],
                        "output_words": sum(len(h.split()) for h in hyps),
                        "same_in_every_pass": all(other == hyps for other, _ in passes[1:])})
        print(json_text.dumps(results[-1]), flush=True)
        results[-1]["hypotheses"] = hyps  # for the parity columns, not printed
    return results


def fairseq_reference(row: str) -> str:
    """The fairseq fp32 row a CTranslate2 row is compared with: same model, same depth."""
    model, engine, _ = row.split("/")
    return f"{model}/fairseq{'-depth1' if engine.endswith('depth1') else ''}/fp32"


def add_parity(results) -> None:
    """Give every CTranslate2 result ``same_as_fairseq`` (identical hypotheses, of how many) and
    ``bleu_minus_fairseq`` against its :func:`fairseq_reference` row, if that row ran."""
    for result in results:
        if "ctranslate2" not in result["row"]:
            continue
        references = [r for r in results if r["row"] == fairseq_reference(result["row"])
                      and r["subset"] == result["subset"]]
        references.sort(key=lambda r: r["threads"] != result["threads"])  # the same thread count first
        if references:
            reference = references[0]
            result["same_as_fairseq"] = sum(a == b for a, b in zip(result["hypotheses"], reference["hypotheses"]))
            result["bleu_minus_fairseq"] = round(result["bleu"] - reference["bleu"], 4)


def speed(result, key) -> str:
    low, high = result[key + "_range"]
    return f"{result[key]} ({low}-{high})" if result["repeats"] > 1 else str(result[key])


def main(argv=None):
    args = parse_args(argv)
    quiet_logging()
    start_benchmark(args, torch.device("cpu"))
    results = []
    from fairseq_sret.conversion.ctranslate2_spec import CT2ExportError
    from fairseq_sret.fairseq_patches import CPUBF16Unsupported

    # each row in a fresh process: CTranslate2 brings its own OpenMP runtime, beside which
    # torch's threads slow down by an order of magnitude once they are more than one
    spawn = multiprocessing.get_context("spawn")
    for threads in args.thread_counts:
        for row in args.rows:
            with spawn.Pool(1) as pool:
                try:
                    results.extend(pool.apply(run_row, (row, args, threads)))
                except CPUBF16Unsupported as refused:  # fairseq-generate --bf16 refuses it too
                    print(f"{row}: not measured on this processor: {refused}", flush=True)
                except CT2ExportError as refused:  # sret-export-ct2 refuses it too
                    print(f"{row}: not measured: CTranslate2 cannot run this checkpoint: {refused}", flush=True)
    add_parity(results)
    repeats = f", median (range) of {args.repeats} passes" if args.repeats > 1 else ""
    print_table(f"beam {args.beam}, batches of {args.batch_size}{repeats}",
                ["model / engine / precision", "threads", "subset", "sentences", "sacreBLEU", "sentences/s",
                 "sentences per CPU second", "identical to fairseq fp32", "BLEU - fairseq fp32"],
                [[r["row"], r["threads"], r["subset"], r["sentences"], f"{r['bleu']:.2f}", speed(r, "sentences_per_s"),
                  speed(r, "sentences_per_cpu_s"), r.get("same_as_fairseq", ""),
                  f"{r['bleu_minus_fairseq']:+.2f}" if "bleu_minus_fairseq" in r else ""] for r in results])
    for result in results:
        del result["hypotheses"]
    finish_benchmark(args, rows=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
