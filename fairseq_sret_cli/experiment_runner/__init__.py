"""The experiment runner: named training configurations (a YAML file), trained side by side,
evaluated, resumable, reported as JSON, markdown and plots (``sret-experiments``)."""

from .experiment_file import Experiment, ExperimentError, Row, Run, load_experiment, parse_experiment
from .report import aggregate, write_results
from .commands import train_command
from ..hardware import cpu_model
from .image_runs import RecordedRuns, collect as collect_image_runs, parse_image_experiment
from .run_evaluation import model_facts
from .runner import run_experiment
from .training_log import parse_training_log, training_summary

__all__ = [
    "Experiment", "ExperimentError", "RecordedRuns", "Row", "Run", "aggregate", "collect_image_runs", "cpu_model",
    "load_experiment", "model_facts", "parse_experiment", "parse_image_experiment", "parse_training_log", "run_experiment",
    "train_command", "training_summary", "write_results",
]
