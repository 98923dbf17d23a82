"""Experiment kinds: what ``sret-experiments`` does with a file, whatever it trains.

Every kind implements :class:`ExperimentKind`: the training command of each run, training the
runs not done yet on :class:`~.scheduler.ProcessScheduler`, reading the runs' results again and
writing the report. :func:`experiment_kind` picks the kind an experiment file names (``kind:``;
none is a translation experiment). A new kind is one class here and its own report module under
:mod:`.report`; the command line, the output lock, the results file's lock and ``--report-only``
stay as they are (:func:`fairseq_sret_cli.experiments.main`).
"""

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Dict, List, Optional, Protocol, Tuple

from .. import UsageError
from .experiment_file import ExperimentError


class ExperimentKind(Protocol):
    """One kind of experiment file, set up from the command line: ``output`` is the folder of its
    runs, ``results_file`` the ``RESULTS/NAME.json`` that records them, ``command`` the command
    line as the results name it."""

    output: Path
    results_file: Path
    command: str

    def commands(self) -> List[List[str]]:
        """The training command of every selected run (``--dry-run``)."""

    def read_recorded(self) -> None:
        """Read the runs an earlier session recorded in the results file (UsageError where it does
        not read, or where results files in the way were not written by this command)."""

    def refresh(self) -> None:
        """``--report-only``: read the finished runs' training again from their folders."""

    def train(self, deadline: Optional[float]) -> List[str]:
        """Train the runs not done yet, reporting as each finishes; returns the runs that failed."""

    def report(self) -> Dict[str, Path]:
        """Write the results files from every run's record, merged under the results file's lock
        with the runs another runner recorded since; returns the files written."""

    def announce(self, written: Dict[str, Path]) -> None:
        """Say which files :meth:`report` wrote."""


def experiment_kind(args, command: str) -> ExperimentKind:
    """The kind ``args.experiment`` names, set up with the command line ``args`` (UsageError for a
    file or options it cannot serve). ``command``: this command as typed, for the results."""
    raw = _raw_file(args.experiment)
    kind = raw.get("kind") if isinstance(raw, dict) else None
    if kind == "vision":
        from .image_kind import ImageKind

        return ImageKind(args, raw, command)
    from .translation_kind import TranslationKind

    return TranslationKind(args, command)


def _raw_file(path) -> Optional[dict]:
    """The experiment file's contents; None where it does not read (the translation loader then
    says what is wrong)."""
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def print_commands(kind: ExperimentKind) -> None:
    for command in kind.commands():
        print(" ".join(shlex.quote(c) for c in command))


def kept_runs(results_file: Path) -> list:
    """The ``earlier_runs`` a results file keeps (recorded runs done again since); none where it
    does not read (:func:`recorded_runs` says so)."""
    try:
        stored = json.loads(results_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    kept = stored.get("earlier_runs") if isinstance(stored, dict) else None
    return [r for r in kept if isinstance(r, dict)] if isinstance(kept, list) else []


def recorded_runs(results_file: Path, force: bool) -> Tuple[Dict[str, dict], List[dict]]:
    """The finished runs an earlier session recorded in ``results_file``: (by run name, all of them)."""
    from .report import done_runs

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
    earlier = [r for r in stored.get("runs", []) + stored.get("earlier_runs", []) if r.get("status") == "done"]
    return done_runs(stored), earlier


def check_paths_fairseq_reads(data, output: Path) -> None:
    """UsageError for a --data or --output that fairseq would split at ':' (a list of data shards,
    of checkpoints to ensemble): the runs would train on other data, or train and then fail to be
    evaluated."""
    from ..evaluation.generate import split_by_fairseq

    problem = split_by_fairseq(data, "--data")
    if not problem and os.pathsep in str(output):
        problem = (f"--output {output}: fairseq reads '{os.pathsep}' in a checkpoint path as a list of checkpoints"
                   f" to ensemble, so the runs could train but not be evaluated; give a folder without '{os.pathsep}'")
    if problem:
        raise UsageError(problem)


def usage_errors(call, *args, **kwargs):
    """``call(*args, **kwargs)``, an ExperimentError (a file or options that cannot serve) raised
    as the command line's UsageError."""
    try:
        return call(*args, **kwargs)
    except ExperimentError as exc:
        raise UsageError(str(exc)) from None


def say_failed(failed: List[str]) -> None:
    print(f"sret-experiments: error: {len(failed)} runs failed: {', '.join(failed)}", file=sys.stderr)

