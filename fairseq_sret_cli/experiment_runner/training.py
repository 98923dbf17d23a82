"""A run's training read from its folder: the log (:mod:`.training_log`) with the CPU trace
(:mod:`.cpu_time`), summarised as ``record.train``."""

from typing import List, Optional, Tuple

from fairseq_sret import json_text

from .cpu_time import cpu_cost_path, read_cpu_trace, seconds_on_path
from .experiment_file import Experiment
from .records import TranslationRunRecord
from .run_folder import RunPaths, read_record, run_paths, write_record
from .training_log import parse_training_log, training_summary


def read_training(paths: RunPaths) -> Tuple[dict, Optional[List[tuple]]]:
    """The run's training log parsed (:func:`parse_training_log`) and, when it kept a CPU
    trace, its cost path (:func:`cpu_cost_path`; None without a trace)."""
    text = paths.train_log.read_text(encoding="utf-8", errors="replace") if paths.train_log.is_file() else ""
    parsed = parse_training_log(text)
    samples = read_cpu_trace(paths)
    return parsed, cpu_cost_path(samples, parsed["starts"]) if samples else None


def summarise_training(experiment: Experiment, paths: RunPaths, record: TranslationRunRecord,
                       training: Optional[Tuple[dict, Optional[List[tuple]]]] = None) -> dict:
    """``record.train`` from the training log (:func:`training_summary`). A run trained by
    more than one process, or cut at its stopping epoch, gets ``cpu_seconds`` from the CPU
    trace (kept with ``eval.curve``) along the path of its checkpoints (:func:`cpu_cost_path`;
    None where the trace does not reach); otherwise the table reads the reaped CPU time of its
    processes (``record.train_cpu_seconds``). ``training``: :func:`read_training`'s, if read."""
    parsed, path = training or read_training(paths)
    summary = training_summary(parsed, experiment.schedule.patience)
    resumed_or_cut = summary["starts"] > 1 or "epochs_trained" in summary
    if path is not None and summary.get("updates") is not None and resumed_or_cut:
        summary["cpu_seconds"] = seconds_on_path(path, summary["updates"])
        if summary["cpu_seconds"] is None and path:  # the trace stops short: what it does measure
            summary["cpu_traced_to"] = {"update": path[-1][0], "seconds": path[-1][1]}
    return summary


def converged_by_log(experiment: Experiment, paths: RunPaths) -> Optional[int]:
    """The epoch at which the run's validation history already meets ``--patience``
    (:func:`~.training_log.stopping_epoch`), None if it does not (or the file sets no patience)."""
    if not experiment.schedule.patience or not paths.train_log.is_file():
        return None
    parsed = parse_training_log(paths.train_log.read_text(encoding="utf-8", errors="replace"))
    return training_summary(parsed, experiment.schedule.patience).get("stopped_at_epoch")


def refresh_training(experiment: Experiment, output) -> List[str]:
    """Read every finished run's training again from its folder (log and CPU trace) with
    today's rules: ``record.train`` (:func:`summarise_training`) and each curve point's CPU
    seconds. The decoded scores stay. Returns the runs whose numbers changed."""
    changed = []
    for run in experiment.runs():
        paths = run_paths(output, run)
        record = read_record(paths)
        if not record.done or not paths.train_log.is_file():
            continue
        before = json_text.dumps([record.train, record.curve], sort_keys=True)
        training = read_training(paths)
        record.train = summarise_training(experiment, paths, record, training)
        for point in record.curve or []:
            point["cpu_seconds"] = seconds_on_path(training[1] or [], point["update"])
        if json_text.dumps([record.train, record.curve], sort_keys=True) != before:
            write_record(paths, record)
            changed.append(run.name)
    return changed
