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
from pathlib import Path
from typing import Optional

from . import HelpFormatter, UsageError, UserError, at_least, user_errors


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


def _vision_file(path) -> Optional[dict]:
    """The contents of an experiment file of ``kind: vision``, else None (a translation file, or
    one that does not read: the translation loader then says what is wrong)."""
    import yaml

    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return raw if isinstance(raw, dict) and raw.get("kind") == "vision" else None


def _command_line(argv) -> str:
    """This command as typed, for the results files."""
    return "sret-experiments " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))


def image_experiment(args, argv, raw: dict, started: float) -> int:
    """An experiment file of ``kind: vision``: sret-train-cifar runs, reported as a table
    (``started``: when the command started, a ``time.time()`` value, for ``--time-limit``)."""
    from .experiment_runner import ExperimentError
    from .experiment_runner.image_runs import (RecordedRuns, collect, earlier_records, parse_image_experiment,
                                               run_image_experiment)
    from .experiment_runner.image_runs import run_folder, train_command, write_image_results
    from .outputs import exclusive, locked

    unsupported = [f"--{name.replace('_', '-')}" for name in ("cpu", "max_update", "max_epoch")
                   if getattr(args, name) not in (None, False)]
    if unsupported:
        raise UsageError(f"{', '.join(unsupported)}: not an option of vision experiments (the training options are"
                         " the file's train.args)")
    try:
        experiment = parse_image_experiment(raw, args.experiment)
        experiment.runs(args.rows, args.seeds)  # a selection of no run is refused
    except ExperimentError as exc:
        raise UsageError(str(exc)) from None
    data = args.data or experiment.data
    if not data:
        raise UsageError("no data: pass --data or set 'data' in the file")
    output = Path(args.output or Path("runs/experiments") / experiment.name)
    command = _command_line(argv)
    if args.dry_run:
        for row, seed in experiment.runs(args.rows, args.seeds):
            command_line = train_command(experiment, row, seed, data, run_folder(output, row, seed))
            print(" ".join(shlex.quote(c) for c in command_line))
        return 0

    results_file = Path(args.results) / f"{experiment.name}.json"
    known, _ = _earlier_results(results_file, args.force)
    recorded = RecordedRuns(known, data, source=str(results_file), earlier=_kept_runs(results_file))

    def report():
        # under the results file's lock, with the runs another runner (another --output) recorded
        # in it since it was read: a writer merges them, never drops them
        with locked(results_file):
            recorded.known = {**recorded.known, **_earlier_results(results_file, args.force)[0]}
            recorded.earlier += [r for r in _kept_runs(results_file) if r not in recorded.earlier]
            _write_image_report()

    def _write_image_report():
        records = collect(experiment, output, data, recorded)
        for path in write_image_results(experiment, records, Path(args.results), command, force=args.force,
                                        earlier=earlier_records(recorded)).values():
            print(f"[experiments] wrote {path}", file=sys.stderr)

    failed = []
    if not args.report_only:
        with exclusive(output, command):
            try:
                failed = run_image_experiment(experiment, data, output, jobs=args.jobs, rows=args.rows,
                                              seeds=args.seeds, on_run_done=report, recorded=recorded,
                                              deadline=None if args.time_limit is None
                                              else started + 60 * args.time_limit)
            except ExperimentError as exc:
                raise UsageError(str(exc)) from None
    report()
    if failed:
        print(f"sret-experiments: error: {len(failed)} runs failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


@user_errors("sret-experiments", interrupted="interrupted; the trainings were stopped and the finished runs recorded: rerun the same command to resume")
def main(argv=None) -> int:
    parser = get_parser()
    args = parser.parse_args(argv)
    for name in ("rows", "seeds"):  # a run named twice would train twice at once in one folder
        chosen = getattr(args, name) or []
        if len(set(chosen)) != len(chosen):
            parser.error(f"--{name} names {sorted({c for c in chosen if chosen.count(c) > 1})} more than once")
    import time

    from .experiment_runner import train_command
    from .experiment_runner.report import check_results_files
    from .experiment_runner.run_folder import run_paths
    from .experiment_runner.training import refresh_training

    started = time.time()
    vision = _vision_file(args.experiment)
    if vision is not None:
        return image_experiment(args, argv, vision, started)
    whole, experiment, data = _translation_experiment(args)
    output = Path(args.output or Path("runs/experiments") / experiment.name)
    if not args.report_only:
        _check_paths_fairseq_reads(data, output)
    if args.dry_run:
        for run in experiment.runs():
            cmd = train_command(experiment, run, data, run_paths(output, run), cpu=args.cpu,
                                max_update=args.max_update, max_epoch=args.max_epoch)
            print(" ".join(shlex.quote(c) for c in cmd))
        return 0
    known, earlier = _earlier_results(Path(args.results) / f"{experiment.name}.json", args.force)
    check_results_files(Path(args.results), experiment.name, force=args.force)
    report = _Report(args, whole, output, known, earlier, _command_line(argv), data)
    if args.report_only:
        for name in refresh_training(experiment, output):
            print(f"[experiments] {name}: its training read again from its log and CPU trace", file=sys.stderr)
        written = report()
    else:
        written = _train(args, experiment, data, output, report, known, started)
    for path in written.values():
        print(path)
    return 0


def _translation_experiment(args):
    """(the whole experiment, the runs selected, the data-bin); UsageError for a file or a
    data-bin that cannot serve."""
    from .experiment_runner import ExperimentError, load_experiment
    from .experiment_runner.commands import check_data

    try:
        whole = load_experiment(args.experiment)
        experiment = whole.select(args.rows, args.seeds)
        whole = whole.with_runs_of(experiment)  # what the results report
    except ExperimentError as exc:
        raise UsageError(str(exc)) from None
    data = args.data or experiment.data
    if not data:
        raise UsageError("no data-bin: pass --data or set 'data' in the file")
    if not args.report_only:
        try:
            check_data(experiment, data)
        except ExperimentError as exc:
            raise UsageError(str(exc)) from None
    return whole, experiment, data


def _check_paths_fairseq_reads(data, output: Path) -> None:
    """UsageError for a --data or --output that fairseq would split at ':' (a list of data shards,
    of checkpoints to ensemble): the runs would train on other data, or train and then fail to be
    evaluated."""
    import os

    from .evaluation.generate import split_by_fairseq

    problem = split_by_fairseq(data, "--data")
    if not problem and os.pathsep in str(output):
        problem = (f"--output {output}: fairseq reads '{os.pathsep}' in a checkpoint path as a list of checkpoints"
                   f" to ensemble, so the runs could train but not be evaluated; give a folder without '{os.pathsep}'")
    if problem:
        raise UsageError(problem)


def _kept_runs(results_file: Path) -> list:
    """The ``earlier_runs`` a results file keeps (recorded runs done again since); none where it
    does not read (:func:`_earlier_results` says so)."""
    import json

    try:
        stored = json.loads(results_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    kept = stored.get("earlier_runs") if isinstance(stored, dict) else None
    return [r for r in kept if isinstance(r, dict)] if isinstance(kept, list) else []


def _earlier_results(results_file: Path, force: bool):
    """The finished runs an earlier session recorded in ``results_file``: (by run name, all of them)."""
    import json

    if not results_file.is_file():
        return {}, []
    try:
        stored = json.loads(results_file.read_text(encoding="utf-8"))
    except ValueError as exc:
        if not force:
            raise UsageError(f"{results_file} is not valid JSON ({exc}); it records the finished runs: restore it"
                             " (git), move it away, or pass --force to replace it") from None
        stored = {}
    if not (isinstance(stored, dict) and isinstance(stored.get("runs"), list)):
        return {}, []
    from .experiment_runner.report import done_runs

    earlier = [r for r in stored.get("runs", []) + stored.get("earlier_runs", []) if r.get("status") == "done"]
    return done_runs(stored), earlier


class _Report:
    """Writes the results of the whole experiment (and the seeds --seeds adds), not the
    --rows/--seeds selection: the runs of the other rows stay in the table and among the runs
    a later command counts as done. Called after every finished run and at the end."""

    def __init__(self, args, whole, output: Path, known: dict, earlier: list, command: str, data: str):
        self.args, self.output, self.known, self.earlier, self.command = args, output, known, earlier, command
        self.data = data  # the runs it reports as done were trained on what this data-bin holds
        self.whole = whole.capped(args.max_update, args.max_epoch)  # the caps the runs trained to

    def __call__(self, *_):
        """Write the results under the results file's lock, with the runs another runner (another
        --output) recorded in it since it was read: a writer merges them, never drops them."""
        from .outputs import locked

        results_file = Path(self.args.results) / f"{self.whole.name}.json"
        with locked(results_file):
            known, earlier = _earlier_results(results_file, self.args.force)
            self.known = {**self.known, **known}
            self.earlier += [r for r in earlier if r not in self.earlier]
            return self._write()

    def _write(self):
        from .experiment_runner import write_results
        from .experiment_runner.settings import collect_records

        args = self.args
        records = collect_records(self.whole, self.output, self.known, args.max_update, args.max_epoch, self.data)
        used = [r for r in records if r.get("status") == "done"]
        kept = [r for r in self.earlier if not any(r.get("config") == u.get("config") and r.get("row") == u.get("row")
                                                   and r.get("seed") == u.get("seed") for u in used)]
        kept = [dict(r, not_matching=self._why_not(r)) for r in kept]
        return write_results(self.whole, records, args.results, self.command, device_note=args.note, earlier=kept)


    def _why_not(self, record: dict) -> str:
        """Why a recorded finished run is not among those reported as done."""
        from .experiment_runner.settings import data_difference_of

        return (data_difference_of(record.get("train_settings"), self.data)
                or "another configuration than the experiment file now gives its row")


def _train(args, experiment, data: str, output: Path, report: _Report, known: dict, started: float) -> dict:
    """Train the runs not done yet (one sret-experiments per output folder: a second would train
    the same runs at once), reporting as they finish; returns the files written."""
    from .experiment_runner import ExperimentError, run_experiment
    from .outputs import exclusive

    with exclusive(output, report.command):
        print(f"[experiments] {experiment.name}: {len(experiment.runs())} runs of {len(experiment.rows)} rows,"
              f" {args.jobs} side by side; runs in {output}", file=sys.stderr)
        try:
            run_experiment(experiment, data, output, jobs=args.jobs, cpu=args.cpu, max_update=args.max_update,
                           max_epoch=args.max_epoch, progress_interval=args.progress_interval,
                           on_run_done=report, known=known, force=args.force,
                           deadline=None if args.time_limit is None else started + 60 * args.time_limit)
        except ExperimentError as exc:  # runs trained with other settings: nothing was started
            raise UsageError(str(exc)) from None
        except RuntimeError as exc:
            report()
            raise UserError(str(exc)) from None
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the trainings were stopped at their last checkpoint
            report()
            raise
        return report()


if __name__ == "__main__":
    sys.exit(main())
