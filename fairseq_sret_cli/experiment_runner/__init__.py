"""The experiment runner: named training configurations (a YAML file), trained side by side,
evaluated, resumable, reported as JSON, markdown and plots (``sret-experiments``).

One runner for every kind of experiment file: :mod:`.kinds` says what a kind implements
(:class:`~.kinds.ExperimentKind`: the runs' training commands, training them, reading their
results again, the report) and picks the kind a file names; :mod:`.scheduler` is the one
scheduler of training processes (``--jobs`` slots, ``--time-limit``, Ctrl-C and SIGTERM).
Translation: :mod:`.translation_kind` on :mod:`.experiment_file`, :mod:`.runner`,
:mod:`.run_evaluation`, :mod:`.settings`; images (``kind: vision``): :mod:`.image_kind` on
:mod:`.image_runs`. Each kind's tables and figures are a module of :mod:`.report`; run records
are typed (:mod:`.records`: :class:`~.records.TranslationRunRecord`, :class:`~.records.ImageRunRecord`).
"""

from .experiment_file import Experiment, ExperimentError, Row, Run, load_experiment, parse_experiment
from .report import aggregate, write_results
from .commands import train_command
from ..hardware import cpu_model
from .image_runs import RecordedRuns, collect as collect_image_runs, parse_image_experiment
from .kinds import ExperimentKind, experiment_kind
from .records import ImageRunRecord, TranslationRunRecord
from .run_evaluation import model_facts
from .runner import run_experiment
from .scheduler import ProcessScheduler
from .training_log import parse_training_log, training_summary

__all__ = [
    "Experiment", "ExperimentError", "ExperimentKind", "ImageRunRecord", "ProcessScheduler", "RecordedRuns", "Row",
    "Run", "TranslationRunRecord", "aggregate", "collect_image_runs", "cpu_model", "experiment_kind",
    "load_experiment", "model_facts", "parse_experiment", "parse_image_experiment", "parse_training_log",
    "run_experiment", "train_command", "training_summary", "write_results",
]
