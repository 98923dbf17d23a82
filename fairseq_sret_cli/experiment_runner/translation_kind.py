"""The translation kind: fairseq-train runs (:mod:`.runner`), evaluated with beam search, reported
by :mod:`.report.translation`."""

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .. import UsageError, UserError
from .commands import check_data, train_command
from .experiment_file import load_experiment
from .kinds import check_paths_fairseq_reads, recorded_runs, usage_errors
from .records import TranslationRunRecord
from .run_folder import run_paths


def recorded_environment(results_file: Path) -> Optional[dict]:
    """The environment ``results_file`` names (where its runs were measured), or None."""
    try:
        env = json.loads(results_file.read_text(encoding="utf-8")).get("environment")
    except (OSError, ValueError, AttributeError):
        return None
    return env if isinstance(env, dict) else None


class TranslationKind:
    """A translation experiment file set up from the command line (:class:`~.kinds.ExperimentKind`).

    Its report covers the whole experiment (and the seeds --seeds adds), not the --rows/--seeds
    selection: the runs of the other rows stay in the table and among the runs a later command
    counts as done."""

    def __init__(self, args, command: str):
        self.args, self.command = args, command
        whole = usage_errors(load_experiment, args.experiment)
        self.experiment = usage_errors(whole.select, args.rows, args.seeds)
        self.whole = whole.with_runs_of(self.experiment).capped(args.max_update, args.max_epoch)
        self.data = args.data or self.experiment.data
        if not self.data:
            raise UsageError("no data-bin: pass --data or set 'data' in the file")
        if not args.report_only:
            usage_errors(check_data, self.experiment, self.data)
        self.output = Path(args.output or Path("runs/experiments") / self.experiment.name)
        if not args.report_only:
            check_paths_fairseq_reads(self.data, self.output)
        self.results_file = Path(args.results) / f"{self.experiment.name}.json"
        self.known: Dict[str, TranslationRunRecord] = {}
        self.earlier: List[TranslationRunRecord] = []

    def commands(self) -> List[List[str]]:
        args = self.args
        return [train_command(self.experiment, run, self.data, run_paths(self.output, run), cpu=args.cpu,
                              max_update=args.max_update, max_epoch=args.max_epoch) for run in self.experiment.runs()]

    def read_recorded(self) -> None:
        from .report import check_results_files

        self.known, self.earlier = self._recorded()
        check_results_files(Path(self.args.results), self.experiment.name, force=self.args.force)

    def refresh(self) -> None:
        from .training import refresh_training

        for name in refresh_training(self.experiment, self.output):
            print(f"[experiments] {name}: its training read again from its log and CPU trace", file=sys.stderr)

    def train(self, deadline: Optional[float]) -> List[str]:
        """Train the runs not done yet (the caller holds the output folder), reporting as they
        finish; a failed run is a UserError once the others are reported."""
        from .runner import run_experiment

        args = self.args
        print(f"[experiments] {self.experiment.name}: {len(self.experiment.runs())} runs of"
              f" {len(self.experiment.rows)} rows, {args.jobs} side by side; runs in {self.output}", file=sys.stderr)
        try:
            usage_errors(run_experiment, self.experiment, self.data, self.output, jobs=args.jobs, cpu=args.cpu,
                         max_update=args.max_update, max_epoch=args.max_epoch,
                         progress_interval=args.progress_interval, on_run_done=self.report, known=self.known,
                         force=args.force, deadline=deadline)
        except RuntimeError as exc:
            self.report()
            raise UserError(str(exc)) from None
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the trainings were stopped at their last checkpoint
            self.report()
            raise
        return []

    def report(self, *_) -> Dict[str, Path]:
        """Write the results under the results file's lock, with the runs another runner (another
        --output) recorded in it since it was read: a writer merges them, never drops them."""
        from ..outputs import locked

        with locked(self.results_file):
            known, earlier = self._recorded()
            self.known = {**self.known, **known}
            self.earlier += [r for r in earlier if r not in self.earlier]
            return self._write()

    def _recorded(self) -> Tuple[Dict[str, TranslationRunRecord], List[TranslationRunRecord]]:
        """The finished runs the results file records (:func:`~.kinds.recorded_runs`), typed."""
        known, earlier = recorded_runs(self.results_file, self.args.force)
        return ({name: TranslationRunRecord.from_json(r) for name, r in known.items()},
                [TranslationRunRecord.from_json(r) for r in earlier])

    def _write(self) -> Dict[str, Path]:
        from .report import write_results
        from .settings import collect_records

        args = self.args
        records = collect_records(self.whole, self.output, self.known, args.max_update, args.max_epoch, self.data)
        used = [r for r in records if r.done]
        kept = [r for r in self.earlier
                if not any(r.config == u.config and r.row == u.row and r.seed == u.seed for u in used)]
        kept = [replace(r, not_matching=self._why_not(r)) for r in kept]
        env = recorded_environment(self.results_file) if args.report_only else None
        return write_results(self.whole, records, args.results, self.command, device_note=args.note, earlier=kept,
                             env=env)

    def _why_not(self, record: TranslationRunRecord) -> str:
        """Why a recorded finished run is not among those reported as done."""
        from .settings import data_difference_of

        return (data_difference_of(record.train_settings, self.data)
                or "another configuration than the experiment file now gives its row")

    def announce(self, written: Dict[str, Path]) -> None:
        for path in written.values():
            print(path)
