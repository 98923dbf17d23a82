"""The image kind (``kind: vision``): ``sret-train-cifar`` runs (:mod:`.image_runs`), reported by
:mod:`.report.images`."""

import sys
from pathlib import Path
from typing import Dict, List, Optional

from .. import UsageError
from . import image_runs
from .kinds import kept_runs, recorded_runs, usage_errors
from .report import write_image_results


class ImageKind:
    """An image experiment file set up from the command line (:class:`~.kinds.ExperimentKind`)."""

    def __init__(self, args, raw: dict, command: str):
        unsupported = [f"--{name.replace('_', '-')}" for name in ("cpu", "max_update", "max_epoch")
                       if getattr(args, name) not in (None, False)]
        if unsupported:
            raise UsageError(f"{', '.join(unsupported)}: not an option of vision experiments (the training options"
                             " are the file's train.args)")
        self.args, self.command = args, command
        self.experiment = usage_errors(image_runs.parse_image_experiment, raw, args.experiment)
        usage_errors(self.experiment.runs, args.rows, args.seeds)  # a selection of no run is refused
        self.data = args.data or self.experiment.data
        if not self.data:
            raise UsageError("no data: pass --data or set 'data' in the file")
        self.output = Path(args.output or Path("runs/experiments") / self.experiment.name)
        self.results_file = Path(args.results) / f"{self.experiment.name}.json"
        self.recorded: Optional[image_runs.RecordedRuns] = None

    def commands(self) -> List[List[str]]:
        return [image_runs.train_command(self.experiment, row, seed, self.data,
                                         image_runs.run_folder(self.output, row, seed))
                for row, seed in self.experiment.runs(self.args.rows, self.args.seeds)]

    def read_recorded(self) -> None:
        known, _ = recorded_runs(self.results_file, self.args.force)
        self.recorded = image_runs.RecordedRuns(known, self.data, source=str(self.results_file),
                                                earlier=kept_runs(self.results_file))

    def refresh(self) -> None:
        """Nothing to read again: a run's ``result.json`` is its training's own summary."""

    def train(self, deadline: Optional[float]) -> List[str]:
        return usage_errors(image_runs.run_image_experiment, self.experiment, self.data, self.output,
                            jobs=self.args.jobs, rows=self.args.rows, seeds=self.args.seeds,
                            on_run_done=self.report, recorded=self.recorded, deadline=deadline,
                            progress_interval=self.args.progress_interval)

    def report(self) -> Dict[str, Path]:
        """Under the results file's lock, with the runs another runner (another --output) recorded
        in it since it was read: a writer merges them, never drops them."""
        from ..outputs import locked

        recorded = self.recorded
        with locked(self.results_file):
            recorded.known = {**recorded.known, **recorded_runs(self.results_file, self.args.force)[0]}
            recorded.earlier += [r for r in kept_runs(self.results_file) if r not in recorded.earlier]
            records = image_runs.collect(self.experiment, self.output, self.data, recorded)
            written = write_image_results(self.experiment, records, Path(self.args.results), self.command,
                                          force=self.args.force, earlier=image_runs.earlier_records(recorded))
        for path in written.values():  # after every run: the table as it stands
            print(f"[experiments] wrote {path}", file=sys.stderr)
        return written

    def announce(self, written: Dict[str, Path]) -> None:
        """:meth:`report` said it already."""
