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
import shlex
import sys
from pathlib import Path
from typing import Callable, Optional, Tuple

from . import HelpFormatter, at_least, finite, user_errors
from .evaluation.generate import refused_generate_args, split_by_fairseq
from .outputs import Outputs, exclusive
from fairseq_sret import json_text


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sret-evaluate", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--data", required=True, help="data-bin written by a prepare script")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="checkpoint file to translate with")
    src.add_argument("--checkpoint-dir", help="run folder; with --average-last N averages its last N checkpoints")
    src.add_argument("--generate-output",
                     help="an existing fairseq-generate output (pieces, no --post-process) of --data to score")
    p.add_argument("--average-last", type=at_least(1), default=None, metavar="N",
                   help="with --checkpoint-dir: average the last N epoch checkpoints (update checkpoints with --by-update)"
                        " into CHECKPOINT_DIR/checkpoint.avgN.pt; 1: the last one itself")
    p.add_argument("--by-update", action="store_true", help="average checkpoint_E_U.pt files instead of checkpointE.pt")
    p.add_argument("--subset", default="test", help="test (default), test1, valid")
    p.add_argument("--beam", type=at_least(1), default=None,
                   help="beam size (default: 5; with --generate-output, the file's)")
    p.add_argument("--lenpen", type=finite, default=1.0)
    p.add_argument("--max-tokens", type=at_least(1), default=8000)
    p.add_argument("--batch-size", type=at_least(1), default=None)
    p.add_argument("--cpu", action="store_true", help="translate on the CPU even if a GPU is present")
    p.add_argument("--generate-args", default="", help="extra fairseq-generate arguments, e.g. \"--max-len-b 50\"")
    p.add_argument("--output-dir", default=None, help="where hypotheses and results go (default: CHECKPOINT_DIR/eval)")
    p.add_argument("--force", action="store_true",
                   help="replace outputs this command did not make, or made with other settings (another"
                        " checkpoint, beam, subset...)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--verbose", action="store_true", help="show fairseq-generate's log")
    return p


def checked_generate_args(p: argparse.ArgumentParser, args) -> list:
    """``--generate-args`` split, after refusing options that do nothing or the wrong thing."""
    try:
        generate_args = shlex.split(args.generate_args)
    except ValueError as exc:
        p.error(f"--generate-args {args.generate_args!r}: {exc}")
    refused = refused_generate_args(generate_args)
    if refused:
        p.error(f"--generate-args: {refused}")
    if args.generate_output is not None:
        for name in ("average_last", "by_update", "batch_size", "generate_args", "cpu"):
            if getattr(args, name) not in (None, False, ""):
                p.error(f"--{name.replace('_', '-')} does nothing with --generate-output (nothing is translated)")
    elif args.average_last is not None and not args.checkpoint_dir:
        p.error("--average-last averages the checkpoints of a run folder: give --checkpoint-dir")
    if args.by_update and args.average_last is None:
        p.error("--by-update chooses which checkpoints --average-last averages: give --checkpoint-dir and --average-last")
    return generate_args


def run_checkpoint(args) -> Tuple[Path, Optional[Callable[[], None]]]:
    """The checkpoint ``--checkpoint-dir`` gives (its best, else its last; with ``--average-last
    N`` the last one or the average of the last N) and, for an average, the function that
    writes it (checked already: it is called once nothing else is in the way)."""
    from fairseq_sret.checkpoints import average_checkpoints, last_n_checkpoints

    run_dir = Path(args.checkpoint_dir)
    by = "update" if args.by_update else "epoch"
    if args.average_last == 1:
        return last_n_checkpoints(run_dir, 1, by=by)[0], None
    if args.average_last:
        paths = last_n_checkpoints(run_dir, args.average_last, by=by)
        averaged = Outputs("sret-evaluate", force=args.force, inputs=paths,
                           settings={"average_last": args.average_last, "by": by})
        checkpoint = run_dir / f"checkpoint.avg{args.average_last}.pt"
        averaged.check([checkpoint])

        def write_average() -> None:
            print(f"[evaluate] averaging {[p.name for p in paths]}", file=sys.stderr)
            averaged.save(average_checkpoints(paths), checkpoint)

        return checkpoint, write_average
    best = run_dir / "checkpoint_best.pt"
    return (best if best.is_file() else run_dir / "checkpoint_last.pt"), None


@user_errors("sret-evaluate")
def main(argv=None) -> int:
    p = get_parser()
    args = p.parse_args(argv)
    generate_args = checked_generate_args(p, args)

    from .evaluation.evaluate import evaluate, format_report, output_files

    checkpoint, beam = args.checkpoint, args.beam if args.beam is not None or args.generate_output else 5
    write_average = None
    if args.checkpoint_dir:
        checkpoint, write_average = run_checkpoint(args)
    if checkpoint:  # translated by fairseq-generate
        split = split_by_fairseq(args.data, "--data") or split_by_fairseq(checkpoint, "the checkpoint")
        if split:
            p.error(split)
    source = Path(checkpoint) if checkpoint else Path(args.generate_output)
    output_dir = Path(args.output_dir) if args.output_dir else source.parent / "eval"
    settings = {"data": str(Path(args.data).resolve()), "subset": args.subset,
                "checkpoint": str(source.resolve()), "beam": beam, "lenpen": args.lenpen,
                "generate_args": args.generate_args}
    if args.generate_output:
        settings = {"data": settings["data"], "subset": args.subset, "generate_output": settings["checkpoint"]}
    outputs = Outputs("sret-evaluate", force=args.force, settings=settings, inputs=[source, args.data])
    written = [output_dir / name for name in output_files(args.subset, generated=not args.generate_output)]
    fix = "give another --output-dir, or pass --force to replace them (nothing else is touched)"
    outputs.check(written, folders=[output_dir], fix=fix)
    with exclusive(output_dir, "sret-evaluate", remove=True,
                   why="two evaluations into one folder would mix their files"):
        outputs.check(written, fix=fix)  # again, now that no other evaluation writes there
        if write_average is not None:
            write_average()
        report = evaluate(
            args.data, checkpoint=checkpoint, subset=args.subset, output_dir=output_dir,
            generate_output=args.generate_output, beam=beam, lenpen=args.lenpen, max_tokens=args.max_tokens,
            batch_size=args.batch_size, cpu=args.cpu, extra_args=generate_args, verbose=args.verbose,
        )
        outputs.record(*written)
    print(json_text.dumps(report, indent=2, ensure_ascii=False) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
