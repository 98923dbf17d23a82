"""Train, evaluate and report the named configurations of an experiment file.

  sret-experiments examples/multi30k/experiments.yaml --data data-bin/multi30k_de_en --jobs 4

Each row x seed is trained with fairseq-train (``--jobs`` of them side by side: one GPU is
far from busy with one small model), evaluated with beam search (best checkpoint and the
average of the last epochs, every test set of the data-bin: BLEU with its signature, chrF),
and written to ``RESULTS/NAME.json``, ``RESULTS/NAME.md`` and PNG plots. Finished runs are
skipped and interrupted ones resume, so a table can be filled over several short sessions:
the runs recorded in ``RESULTS/NAME.json`` count as done (the checkpoints need not be
there), so committing that file carries a table from one machine to the next.
``--time-limit`` stops in time to write the results; ``--report-only`` rewrites them.
"""

import argparse
import shlex
import sys

from . import HelpFormatter, at_least, user_errors


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sret-experiments", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("experiment", help="experiment file (YAML), e.g. examples/multi30k/experiments.yaml")
    p.add_argument("--data", default=None, help="prepared data-bin (default: the file's 'data')")
    p.add_argument("--output", default=None, help="folder of the runs (default: runs/experiments/NAME)")
    p.add_argument("--results", default="docs/results", help="where NAME.json/.md and the plots go (default: %(default)s)")
    p.add_argument("--jobs", type=at_least(1), default=1, help="trainings side by side (default: 1)")
    p.add_argument("--rows", nargs="+", default=None, help="only these row ids")
    p.add_argument("--seeds", type=at_least(0), nargs="+", default=None, help="only these seeds (every selected row)")
    p.add_argument("--cpu", action="store_true", help="train and translate on the CPU")
    p.add_argument("--max-update", type=at_least(1), default=None, help="override the file's update cap (smoke runs)")
    p.add_argument("--max-epoch", type=at_least(1), default=None, help="override the file's epoch cap (smoke runs)")
    p.add_argument("--progress-interval", type=at_least(0.0, float), default=60.0,
                   help="seconds between progress lines (default: 60; 0: none)")
    p.add_argument("--time-limit", type=at_least(0.0, float), default=None, metavar="MINUTES",
                   help="start no run after this many minutes and stop the trainings still going (they resume"
                        " from their last checkpoint in the same --output folder)")
    p.add_argument("--report-only", action="store_true",
                   help="write the results of the finished runs, their training read again from the logs and CPU"
                        " traces in their folders; train nothing")
    p.add_argument("--dry-run", action="store_true", help="print the training commands and exit")
    p.add_argument("--note", default="", help="a note on the machine recorded with the results (e.g. 'H100, 4 jobs')")
    p.add_argument("--force", action="store_true",
                   help="train again from scratch the runs whose folder holds a training with other settings (an"
                        " edited row), and replace results files this command did not write")
    return p


def _command_line(argv) -> str:
    """This command as typed, for the results files."""
    return "sret-experiments " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))


@user_errors("sret-experiments", interrupted="interrupted; the trainings were stopped and the finished runs recorded: rerun the same command to resume")
def main(argv=None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    for name in ("rows", "seeds"):  # a run named twice would train twice at once in one folder
        chosen = getattr(args, name) or []
        if len(set(chosen)) != len(chosen):
            parser.error(f"--{name} names {sorted({c for c in chosen if chosen.count(c) > 1})} more than once")
    import time

    from .experiment_runner.kinds import experiment_kind, print_commands, say_failed
    from .outputs import exclusive

    started = time.time()
    kind = experiment_kind(args, _command_line(argv))
    if args.dry_run:
        print_commands(kind)
        return 0
    kind.read_recorded()
    failed = []
    if args.report_only:
        kind.refresh()
    else:  # one sret-experiments per output folder: a second would train the same runs at once
        with exclusive(kind.output, kind.command):
            failed = kind.train(None if args.time_limit is None else started + 60 * args.time_limit)
            written = kind.report()
    if args.report_only:
        written = kind.report()
    kind.announce(written)
    if failed:
        say_failed(failed)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
