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

from . import HelpFormatter, at_least, finite, user_errors
from .outputs import Outputs
from fairseq_sret import json_text


#: fairseq-generate options that sret-evaluate sets itself, or that would make its report describe
#: another model, data or search than the one that ran: refused in --generate-args, with what to
#: give instead. Other options pass through and are recorded in the report.
OWN_GENERATE_OPTIONS = {
    "--path": "give --checkpoint", "--beam": "give --beam", "--lenpen": "give --lenpen",
    "--gen-subset": "give --subset", "--max-tokens": "give --max-tokens", "--batch-size": "give --batch-size",
    "--max-sentences": "give --batch-size", "--cpu": "give --cpu", "--results-path": "give --output-dir",
    "--post-process": "the score post-processes the pieces itself", "--remove-bpe": "the score post-processes the"
    " pieces itself", "--source-lang": "the data-bin's pair is used", "--target-lang": "the data-bin's pair is used",
    "--user-dir": "sret-evaluate loads the plugin itself",
}


def refused_generate_args(tokens) -> str:
    """Why ``tokens`` (the split ``--generate-args``) cannot pass to fairseq-generate, or "" if
    they can: an option of :data:`OWN_GENERATE_OPTIONS`, also abbreviated (argparse takes a
    unique prefix) or as ``--option=value``; ``-s``/``-t``; a positional (another data-bin)."""
    for i, token in enumerate(tokens):
        name = token.split("=", 1)[0]
        if name in ("-s", "-t"):
            return f"{token} chooses a language pair; the data-bin's pair is used"
        if name.startswith("--") and len(name) > 3:
            for option, instead in OWN_GENERATE_OPTIONS.items():
                if option.startswith(name):
                    given = option if name == option else f"{token} (that is {option})"
                    return f"{given} is set by sret-evaluate itself: {instead}"
        elif not token.startswith("-") and (i == 0 or not tokens[i - 1].startswith("-")):
            return f"{token!r} is not an option (the data-bin is --data; options take one value each)"
    return ""


@user_errors("sret-evaluate")
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sret-evaluate", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--data", required=True, help="data-bin written by a prepare script")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="checkpoint file to translate with")
    src.add_argument("--checkpoint-dir", help="run folder; with --average-last N averages its last N checkpoints")
    src.add_argument("--generate-output",
                     help="an existing fairseq-generate output (pieces, no --post-process) of --data to score")
    p.add_argument("--average-last", type=at_least(1), default=None, metavar="N",
                   help="with --checkpoint-dir: average the last N epoch checkpoints (update checkpoints with --by-update)"
                        " into CHECKPOINT_DIR/checkpoint.avgN.pt")
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
    args = p.parse_args(argv)
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

    from .evaluation.evaluate import evaluate, format_report, output_files

    checkpoint, beam = args.checkpoint, args.beam if args.beam is not None or args.generate_output else 5
    if args.checkpoint_dir:
        from fairseq_sret.checkpoints import average_checkpoints, last_n_checkpoints

        run_dir = Path(args.checkpoint_dir)
        if args.average_last and args.average_last > 1:
            by = "update" if args.by_update else "epoch"
            paths = last_n_checkpoints(run_dir, args.average_last, by=by)
            averaged = Outputs("sret-evaluate", force=args.force, inputs=paths,
                               settings={"average_last": args.average_last, "by": by})
            print(f"[evaluate] averaging {[p.name for p in paths]}", file=sys.stderr)
            checkpoint = averaged.save(average_checkpoints(paths), run_dir / f"checkpoint.avg{args.average_last}.pt")
        else:
            checkpoint = run_dir / "checkpoint_best.pt"
            if not checkpoint.is_file():
                checkpoint = run_dir / "checkpoint_last.pt"
    source = Path(checkpoint) if checkpoint else Path(args.generate_output)
    output_dir = Path(args.output_dir) if args.output_dir else source.parent / "eval"
    settings = {"data": str(Path(args.data).resolve()), "subset": args.subset,
                "checkpoint": str(source.resolve()), "beam": beam, "lenpen": args.lenpen,
                "generate_args": args.generate_args}
    if args.generate_output:
        settings = {"data": settings["data"], "subset": args.subset, "generate_output": settings["checkpoint"]}
    outputs = Outputs("sret-evaluate", force=args.force, settings=settings, inputs=[source, args.data])
    written = [output_dir / name for name in output_files(args.subset, generated=not args.generate_output)]
    outputs.check(written, fix="give another --output-dir, or pass --force to replace them (nothing else is touched)")
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
