"""Plot how the LRC coefficients (learnable residual scales) of each layer evolve during
training, from the checkpoints of a run (the paper's "evolution of coefficients" figure).

  sret-plot-lrc runs/multi30k/checkpoints                 # -> .../lrc.png
  sret-plot-lrc runs/multi30k/checkpoints --output lrc.png --table

Needs matplotlib for the PNG (pip install 'fairseq-sret[plot]'); without it the
coefficients are printed as a table. Save checkpoints often (--save-interval-updates)
for a smooth curve.
"""

import argparse
import sys
from pathlib import Path

from . import HelpFormatter, user_errors
from .outputs import Outputs


FORMATS = ("png", "pdf", "svg")


def checkpoints_of(inputs, run_checkpoints, error) -> list:
    """The checkpoint files of ``inputs`` (a run folder stands for its checkpoint*.pt); ``error``
    for a folder without any, or a checkpoint reached twice (its point would be drawn twice)."""
    paths, seen = [], {}
    for given in inputs:
        found = run_checkpoints(Path(given)) if Path(given).is_dir() else [Path(given)]
        if not found:
            error(f"no checkpoint*.pt in {given}")
        for path in found:
            key = str(path.resolve())
            if key in seen:
                error(f"{path} is given twice (as {seen[key]} and {given}): give each run folder or checkpoint once")
            seen[key] = given
            paths.append(path)
    return paths


@user_errors("sret-plot-lrc")
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sret-plot-lrc", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("inputs", nargs="+", help="a run folder (its checkpoint*.pt are read) or checkpoint files")
    p.add_argument("--output", default=None,
                   help="the figure to write, .png, .pdf or .svg (default: RUN_DIR/lrc.png)")
    p.add_argument("--table", action="store_true", help="also print the table when matplotlib is available")
    p.add_argument("--title", default="LRC coefficients")
    p.add_argument("--force", action="store_true", help="replace an output file this command did not make")
    args = p.parse_args(argv)

    from .evaluation import lrc

    paths = checkpoints_of(args.inputs, lrc.run_checkpoints, p.error)
    run_dir = Path(args.inputs[0]) if Path(args.inputs[0]).is_dir() else paths[0].parent
    output = Path(args.output) if args.output else run_dir / "lrc.png"
    outputs = Outputs("sret-plot-lrc", force=args.force, inputs=paths,
                      settings={"inputs": [str(Path(x).resolve()) for x in args.inputs], "title": args.title})
    outputs.check([output])  # an input in the way is named as such first
    file_format = output.suffix.lower().lstrip(".")
    if file_format not in FORMATS:
        p.error(f"--output {output}: the figure is written as {', '.join(FORMATS)}; give a file name ending in one")
    print(f"[lrc] reading {len(paths)} checkpoints", file=sys.stderr)
    traj = lrc.collect(paths)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        matplotlib = None
    if matplotlib is None or args.table:
        print(lrc.format_table(traj))
    if matplotlib is None:
        print("[lrc] matplotlib is not installed (pip install 'fairseq-sret[plot]'): printed a table instead of "
              "the plot", file=sys.stderr)
        return 0
    with outputs.writing(output) as tmp:
        lrc.plot(traj, tmp, title=args.title, file_format=file_format)
    out = output
    print(f"[lrc] wrote {out}", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
