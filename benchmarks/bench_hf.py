"""The transformers export of a trained translation model against fairseq-generate: the same
hypotheses? the same BLEU? how fast? (docs/hf.md)

    python -m benchmarks.bench_hf --checkpoint runs/multi30k/checkpoints/checkpoint_last.pt \\
        --data-bin runs/multi30k/data-bin [--beam 5] [--lenpen 1.0] [--batch-size 64] [--threads 1]

1. Exports the checkpoint with sret-export-hf's library function (to a temporary folder, or
   uses ``--exported DIR``, which must be an export of ``--checkpoint``: the fingerprint of the
   checkpoint file it records is checked before anything runs).
2. Per search (greedy, then beam ``--beam``): fairseq-generate translates the test subset of
   the data-bin (the plugin, in this process, ``--batch-size``, max length 200). Then, on the
   batches fairseq-generate makes, alternating batch by batch, fairseq's ``SequenceGenerator``
   (what fairseq-generate runs per batch) translates the binarised sentences and the exported
   model translates the same sentences' raw text (``text/test.raw.<src>``) through its own
   tokenizer and ``generate()``, left-padded as fairseq batches them.
3. Printed: the sentences whose hypotheses (pieces) are identical to fairseq-generate's,
   sacreBLEU of both against the raw references, and sentences/s of both: the test set over
   the summed generation time in this process's CPU time (one thread: what else runs on a
   shared machine adds little).
"""

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import (
    benchmark_parser, finish_benchmark, finite_float, positive_int, print_table, start_benchmark,
)


def build_parser():
    p = benchmark_parser(__doc__, smoke=False, device=False)
    p.set_defaults(threads=1)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data-bin", required=True)
    p.add_argument("--exported", help="an sret-export-hf folder of the checkpoint (default: export to a temporary one)")
    p.add_argument("--subset", default="test")
    p.add_argument("--beam", type=positive_int, default=5)
    p.add_argument("--lenpen", type=finite_float, default=1.0)
    p.add_argument("--batch-size", type=positive_int, default=64)
    return p


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def fairseq_generate(data_bin, checkpoint, subset, beam, lenpen, batch_size, work):
    """fairseq-generate's hypotheses (pieces, in sentence order)."""
    from fairseq_sret_cli.evaluation.generate import read_hypotheses, run_generate

    output, _ = run_generate(data_bin, checkpoint, Path(work) / f"fairseq-beam{beam}", subset=subset, beam=beam,
                             lenpen=lenpen, batch_size=batch_size, max_tokens=1_000_000, cpu=True)
    return read_hypotheses(output)


def pieces_of(tokenizer, row) -> str:
    """A generated row (start token first) as fairseq prints a hypothesis: its pieces up to </s>."""
    row = row[1:]
    row = row[: row.index(2)] if 2 in row else row
    return " ".join(tokenizer.convert_ids_to_tokens(row))


def translate_both(checkpoint, data_bin, subset, model, tokenizer, sources, beam, lenpen, batch_size):
    """On the batches fairseq-generate makes, alternating batch by batch: fairseq's
    SequenceGenerator (what fairseq-generate runs per batch) on the binarised sentences, and
    generate() on the same sentences' raw text through the exported tokenizer (left-padded, as
    fairseq batches). Returns generate()'s hypotheses (pieces, in sentence order) and the
    sentences/s of both (this process's CPU time)."""
    import fairseq_sret.models  # noqa: F401  (registers sret_transformer)
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides={"data": str(data_bin)})
    task.load_dataset(subset)
    batches = task.get_batch_iterator(
        task.dataset(subset), max_tokens=1_000_000, max_sentences=batch_size, required_batch_size_multiple=1,
    ).next_epoch_itr(shuffle=False)
    generator = SequenceGenerator([models[0].eval()], task.target_dictionary, beam_size=beam, len_penalty=lenpen,
                                  max_len_b=200)
    tokenizer.padding_side = "left"
    seconds = {"fairseq": 0.0, "transformers": 0.0}
    hypotheses = [None] * len(sources)
    for sample in batches:
        ids = sample["id"].tolist()
        inputs = tokenizer([sources[i] for i in ids], padding=True, return_tensors="pt")
        start = time.process_time()
        with torch.no_grad():
            task.inference_step(generator, [models[0]], sample)
        seconds["fairseq"] += time.process_time() - start
        start = time.process_time()
        with torch.no_grad():
            out = model.generate(**inputs, num_beams=beam, length_penalty=lenpen)
        seconds["transformers"] += time.process_time() - start
        for i, row in zip(ids, out.tolist()):
            hypotheses[i] = pieces_of(tokenizer, row)
    return hypotheses, {name: len(sources) / s for name, s in seconds.items()}


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.exported:
        from fairseq_sret.hf.convert import ExportError, check_exported_from

        try:
            check_exported_from(args.exported, args.checkpoint)
        except ExportError as exc:
            parser.error(f"--exported: {exc}")
    start_benchmark(args, torch.device("cpu"))
    import fairseq_sret.hf  # noqa: F401
    from fairseq_sret_cli.data.subword import SentencePieceCodec
    from fairseq_sret_cli.evaluation.bleu import sacrebleu_detok
    from fairseq_sret.hf.convert import MARKER, export_checkpoint
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    data_bin = Path(args.data_bin)
    with tempfile.TemporaryDirectory() as work:
        exported = args.exported or Path(work) / "hf"
        if not args.exported:
            export_checkpoint(args.checkpoint, data_bin, exported)
        model = AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
        tokenizer = AutoTokenizer.from_pretrained(exported)
        record = json.loads((Path(exported) / MARKER).read_text())
        src, tgt = record["source_lang"], record["target_lang"]
        sources = (data_bin / "text" / f"{args.subset}.raw.{src}").read_text(encoding="utf-8").splitlines()
        references = (data_bin / "text" / f"{args.subset}.raw.{tgt}").read_text(encoding="utf-8").splitlines()
        print(f"checkpoint {args.checkpoint}; {len(sources)} sentences of {args.subset}; batch size {args.batch_size};"
              f" length penalty {args.lenpen}; max length 200")
        rows = []
        for beam in (1, args.beam):
            expected = fairseq_generate(data_bin, args.checkpoint, args.subset, beam, args.lenpen, args.batch_size, work)
            got, rates = translate_both(args.checkpoint, data_bin, args.subset, model, tokenizer, sources, beam,
                                        args.lenpen, args.batch_size)
            same = sum(a == b for a, b in zip(expected, got))
            bleu = [sacrebleu_detok([SentencePieceCodec.decode(h) for h in hyps], references).score
                    for hyps in (expected, got)]
            rows.append(["greedy" if beam == 1 else f"beam {beam}",
                         f"{same}/{len(expected)} ({100 * same / len(expected):.1f}%)", f"{bleu[0]:.2f}",
                         f"{bleu[1]:.2f}", f"{rates['fairseq']:.1f}", f"{rates['transformers']:.1f}"])
            print(f"{rows[-1][0]}: {rows[-1][1]} identical hypotheses", flush=True)
    print_table(f"fairseq-generate against the transformers export ({args.subset})",
                ["search", "identical hypotheses", "sacreBLEU fairseq-generate", "sacreBLEU generate()",
                 "sentences/s fairseq", "sentences/s transformers"], rows)
    finish_benchmark(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
