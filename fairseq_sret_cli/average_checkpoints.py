"""Average the parameters of fairseq checkpoints (our implementation of fairseq's
scripts/average_checkpoints.py, which its pip package does not ship).

  sret-average-checkpoints --inputs RUN_DIR --num-epoch-checkpoints 5 --output RUN_DIR/avg5.pt
  sret-average-checkpoints --inputs RUN_DIR --num-update-checkpoints 10 --output avg.pt
  sret-average-checkpoints --inputs a.pt b.pt c.pt --output avg.pt

The result keeps everything but the parameters (config, training state) from the newest
input checkpoint.
"""

import argparse
import sys
from pathlib import Path

from . import HelpFormatter, at_least, user_errors


@user_errors("sret-average-checkpoints")
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sret-average-checkpoints", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True,
                   help="checkpoint files, or one run folder with --num-epoch/update-checkpoints")
    p.add_argument("--output", required=True,
                   help="the averaged checkpoint to write (never one of the inputs; a file this command did not"
                        " make is replaced only with --force)")
    n = p.add_mutually_exclusive_group()
    n.add_argument("--num-epoch-checkpoints", type=at_least(1), help="average the last N checkpointEPOCH.pt of the folder")
    n.add_argument("--num-update-checkpoints", type=at_least(1), help="average the last N checkpoint_EPOCH_UPDATE.pt")
    p.add_argument("--checkpoint-upper-bound", type=at_least(0), default=None,
                   help="ignore checkpoints after this epoch / update number")
    p.add_argument("--force", action="store_true", help="replace an output file this command did not make")
    args = p.parse_args(argv)

    from fairseq_sret.checkpoints import average_checkpoints, last_n_checkpoints

    from .outputs import Outputs

    if args.num_epoch_checkpoints or args.num_update_checkpoints:
        if len(args.inputs) != 1 or not Path(args.inputs[0]).is_dir():
            p.error("--num-epoch-checkpoints/--num-update-checkpoints need a single run folder as --inputs")
        by, count = ("epoch", args.num_epoch_checkpoints) if args.num_epoch_checkpoints else \
            ("update", args.num_update_checkpoints)
        paths = last_n_checkpoints(args.inputs[0], count, by=by, upper_bound=args.checkpoint_upper_bound)
    else:
        if args.checkpoint_upper_bound is not None:
            p.error("--checkpoint-upper-bound selects among a run folder's checkpoints: give it with"
                    " --num-epoch-checkpoints or --num-update-checkpoints")
        paths = [Path(x) for x in args.inputs]
    outputs = Outputs("sret-average-checkpoints", force=args.force, inputs=paths,
                      settings={"inputs": [str(Path(x).resolve()) for x in args.inputs],
                                "num_epoch_checkpoints": args.num_epoch_checkpoints,
                                "num_update_checkpoints": args.num_update_checkpoints,
                                "checkpoint_upper_bound": args.checkpoint_upper_bound})
    outputs.check([args.output])
    print(f"averaging {len(paths)} checkpoints (newest first):", file=sys.stderr)
    for path in paths:
        print(f"  {path}", file=sys.stderr)
    outputs.save(average_checkpoints(paths), args.output)
    print(f"wrote {args.output}", file=sys.stderr)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
