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

from . import HelpFormatter, user_errors


@user_errors("sret-average-checkpoints")
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sret-average-checkpoints", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True,
                   help="checkpoint files, or one run folder with --num-epoch/update-checkpoints")
    p.add_argument("--output", required=True, help="the averaged checkpoint to write")
    n = p.add_mutually_exclusive_group()
    n.add_argument("--num-epoch-checkpoints", type=int, help="average the last N checkpointEPOCH.pt of the folder")
    n.add_argument("--num-update-checkpoints", type=int, help="average the last N checkpoint_EPOCH_UPDATE.pt")
    p.add_argument("--checkpoint-upper-bound", type=int, default=None,
                   help="ignore checkpoints after this epoch / update number")
    args = p.parse_args(argv)

    from fairseq_sret.nmt_checkpoints import average_checkpoints, last_n_checkpoints, save_checkpoint

    if args.num_epoch_checkpoints or args.num_update_checkpoints:
        if len(args.inputs) != 1 or not Path(args.inputs[0]).is_dir():
            p.error("--num-epoch-checkpoints/--num-update-checkpoints need a single run folder as --inputs")
        by, count = ("epoch", args.num_epoch_checkpoints) if args.num_epoch_checkpoints else \
            ("update", args.num_update_checkpoints)
        paths = last_n_checkpoints(args.inputs[0], count, by=by, upper_bound=args.checkpoint_upper_bound)
    else:
        paths = [Path(x) for x in args.inputs]
    print(f"averaging {len(paths)} checkpoints (newest first):", file=sys.stderr)
    for path in paths:
        print(f"  {path}", file=sys.stderr)
    out = save_checkpoint(average_checkpoints(paths), args.output)
    print(f"wrote {out}", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
