"""Evaluate a checkpoint on a data-bin made by sret-prepare, the way the
literature reports each benchmark:

  IWSLT'14 De-En   tokenized BLEU (Moses-tokenized, lowercased references) + lowercased sacreBLEU
  WMT'14 En-De     sacreBLEU (detokenized, cased, with its signature) + compound-split BLEU
  Multi30k         sacreBLEU + tokenized lowercased BLEU

  sret-evaluate --data data-bin/iwslt14_de_en --checkpoint checkpoints/iwslt14/checkpoint_best.pt
  sret-evaluate --data data-bin/wmt14_en_de --checkpoint-dir checkpoints/wmt14 --average-last 5
  sret-evaluate --data DATA --generate-output generate-test.txt   # score an existing output
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

from . import HelpFormatter, user_errors


@user_errors("sret-evaluate")
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sret-evaluate", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--data", required=True, help="data-bin written by a prepare script")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="checkpoint file to translate with")
    src.add_argument("--checkpoint-dir", help="run folder; with --average-last N averages its last N checkpoints")
    src.add_argument("--generate-output", help="an existing fairseq-generate output (pieces, no --post-process) to score")
    p.add_argument("--average-last", type=int, default=0, metavar="N",
                   help="with --checkpoint-dir: average the last N epoch checkpoints (update checkpoints with --by-update)")
    p.add_argument("--by-update", action="store_true", help="average checkpoint_E_U.pt files instead of checkpointE.pt")
    p.add_argument("--subset", default="test", help="test (default), test1, valid")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=8000)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--cpu", action="store_true", help="translate on the CPU even if a GPU is present")
    p.add_argument("--generate-args", default="", help="extra fairseq-generate arguments, e.g. \"--max-len-b 50\"")
    p.add_argument("--output-dir", default=None, help="where hypotheses and results go (default: CHECKPOINT_DIR/eval)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--verbose", action="store_true", help="show fairseq-generate's log")
    args = p.parse_args(argv)

    from .evaluation.evaluate import evaluate, format_report

    checkpoint = args.checkpoint
    if args.checkpoint_dir:
        from fairseq_sret.nmt_checkpoints import average_checkpoints, last_n_checkpoints, save_checkpoint

        run_dir = Path(args.checkpoint_dir)
        if args.average_last > 1:
            by = "update" if args.by_update else "epoch"
            paths = last_n_checkpoints(run_dir, args.average_last, by=by)
            print(f"[evaluate] averaging {[p.name for p in paths]}", file=sys.stderr)
            checkpoint = save_checkpoint(average_checkpoints(paths), run_dir / f"checkpoint.avg{args.average_last}.pt")
        else:
            checkpoint = run_dir / "checkpoint_best.pt"
            if not checkpoint.is_file():
                checkpoint = run_dir / "checkpoint_last.pt"
    report = evaluate(
        args.data, checkpoint=checkpoint, subset=args.subset, output_dir=args.output_dir,
        generate_output=args.generate_output, beam=args.beam, lenpen=args.lenpen, max_tokens=args.max_tokens,
        batch_size=args.batch_size, cpu=args.cpu, extra_args=shlex.split(args.generate_args), verbose=args.verbose,
    )
    print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
