"""The experiment runner: named training configurations (a YAML file), trained side by side,
evaluated, resumable, reported as JSON, markdown and plots (``sret-experiments``)."""

from .experiment_file import Experiment, ExperimentError, Row, Run, load_experiment, parse_experiment
from .report import aggregate, write_results
from .runner import parse_training_log, run_experiment, train_command, training_summary

__all__ = [
    "Experiment", "ExperimentError", "Row", "Run", "aggregate", "load_experiment", "parse_experiment",
    "parse_training_log", "run_experiment", "train_command", "training_summary", "write_results",
]
