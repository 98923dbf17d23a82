"""The report of an experiment, one module a kind: :mod:`.translation` (with
:mod:`.translation_figures` and :mod:`.scores`) and :mod:`.images`; :mod:`.common` holds what
both tables say."""

from .common import close_rows, done_runs
from .images import cpu_time_ratios, epoch_cpu_seconds, row_epoch_cpu_seconds, seconds_by_epoch, write_image_results
from .scores import aggregate, evaluation_keys, primary_score, row_devices, run_values
from .translation import (check_results_files, cut_runs, environment, learning_curves, markdown, mixed_devices,
                          restarted_runs, write_results)
from .translation_figures import FIGURES, figure_caption, plot

__all__ = [
    "FIGURES", "aggregate", "check_results_files", "close_rows", "cpu_time_ratios", "cut_runs", "done_runs",
    "environment", "epoch_cpu_seconds", "evaluation_keys", "figure_caption", "learning_curves", "markdown",
    "mixed_devices", "plot", "primary_score", "restarted_runs", "row_devices", "row_epoch_cpu_seconds", "run_values",
    "seconds_by_epoch", "write_image_results", "write_results",
]
