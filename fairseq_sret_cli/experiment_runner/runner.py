"""Train and evaluate the runs of an experiment file, resumably.

Every run (row x seed) lives in ``OUTPUT/<row>/seed<S>/``: ``checkpoints/``, ``train.log``
(fairseq's JSON log), ``eval/`` and ``run.json``. A run whose ``run.json`` says ``done`` is
skipped, an interrupted training resumes from ``checkpoint_last.pt`` (fairseq's default),
so a table can be filled over several short sessions. ``jobs`` trainings run side by side
(one GPU is far from busy with one small fairseq model); each is evaluated as soon as it
ends: beam search on every subset with every checkpoint kind of the file (``best``,
``last``, ``lastN`` = average of the last N epoch checkpoints), scored by
:func:`fairseq_sret_cli.evaluation.evaluate.evaluate` (sacreBLEU with signature, chrF, ...).
"""

import hashlib
import functools
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from fairseq_sret import USER_DIR
from fairseq_sret.atomic_files import replacing

from .. import log as lab_log

from .experiment_file import AVERAGE, CHECKPOINT_KINDS, Experiment, ExperimentError, Row, Run
from fairseq_sret import json_text

_LOG_RECORD = re.compile(r"\| (train_inner|train|valid) \| (\{.*\})\s*$")
# fairseq's trainer, when a training process starts: from a checkpoint, or from scratch
_LOG_LOADED = re.compile(r"\| Loaded checkpoint .* \(epoch \d+ @ (\d+) updates\)\s*$")
_LOG_FRESH = re.compile(r"\| No existing checkpoint found ")
_UPDATE_KEYS = ("num_updates", "train_num_updates", "valid_num_updates")
_UPDATE_IN_RECORD = re.compile(r'"(?:train_|valid_)?num_updates": "?([0-9.]+)')


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def reap(process: subprocess.Popen, block: bool = False):
    """``(returncode, cpu_seconds)`` of a child once it has ended, else ``(None, 0.0)``.

    The CPU time (user + system) is the rise of this process's reaped-children usage across
    the one call that reaps ``process``: exact while nothing else is reaped in between
    (the runner reaps from one thread).
    """
    before = _children_cpu_seconds()
    code = process.wait() if block else process.poll()
    return code, (_children_cpu_seconds() - before) if code is not None else 0.0


def add_cpu_seconds(record: dict, seconds: float) -> None:
    """Add one training process's CPU time to the run's total (a resumed run has several)."""
    record["train_cpu_seconds"] = round(record.get("train_cpu_seconds", 0.0) + seconds, 1)
    record["train_processes"] = record.get("train_processes", 0) + 1


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), for the hardware line of every figure."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(cpu: bool = False) -> str:
    """The first GPU's name, or ``CPU <model>`` with ``cpu`` or where there is no GPU."""
    import torch

    if not cpu and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU {cpu_model()}"


def add_training_device(record: dict, device: str) -> None:
    """Note the device a training process of the run starts on (``trained_on``, in order): a run
    resumed on another machine names both, and its CPU seconds are not one processor's."""
    devices = record.setdefault("trained_on", [])
    if device not in devices:
        devices.append(device)


def process_cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU seconds of a running process and its reaped children (Linux
    ``/proc``); None where that cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # utime, stime, cutime, cstime: fields 14-17 of proc(5), counted from the state field (3)
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class CpuTrace:
    """Samples a training process's CPU time against the update count it logs, so that a
    checkpoint's update can be read as the training CPU seconds it cost (:func:`cpu_seconds_at`).

    Each line of ``cpu_trace.jsonl``: ``{"pid", "from_update", "update", "process_cpu_seconds"}``,
    the process, the update it resumed from (0 from scratch; None until its log says), the
    last update it logged and its own CPU seconds so far. ``log_offset``: where this process's
    lines begin in the training log (a resumed run's log holds the earlier processes' too)."""

    def __init__(self, paths: "RunPaths", pid: int, log_offset: int = 0, interval: float = 30.0):
        self.paths, self.pid, self.interval = paths, pid, interval
        self.last_sample, self.read_to, self.update, self.from_update = 0.0, log_offset, None, None

    def poll(self, now: float) -> None:
        if now - self.last_sample < self.interval:
            return
        self.last_sample = now
        self._read_log()
        self._write(process_cpu_seconds(self.pid))

    def finish(self, cpu_seconds: float) -> None:
        """The last sample, once the process has ended: its last logged update and all its CPU
        time (``cpu_seconds``, from reaping it). Without it the trace would stop at the last
        poll, short of the final update whenever the last epoch ends between two polls."""
        self._read_log()
        self._write(cpu_seconds)

    def _read_log(self) -> None:
        try:
            with open(self.paths.train_log, "rb") as handle:
                handle.seek(self.read_to)
                chunk = handle.read()
        except OSError:
            return
        cut = chunk.rfind(b"\n") + 1
        self.read_to += cut
        for line in chunk[:cut].decode("utf-8", errors="replace").splitlines():
            loaded = _LOG_LOADED.search(line)
            if loaded or _LOG_FRESH.search(line):
                self.from_update = int(loaded.group(1)) if loaded else 0
                continue
            match = _LOG_RECORD.search(line)
            if match:
                found = _UPDATE_IN_RECORD.search(match.group(2))
                if found:
                    self.update = int(float(found.group(1)))

    def _write(self, seconds: Optional[float]) -> None:
        if self.update is None or seconds is None:
            return
        sample = {"pid": self.pid, "from_update": self.from_update, "update": self.update,
                  "process_cpu_seconds": round(seconds, 1)}
        with open(self.paths.cpu_trace, "a", encoding="utf-8") as handle:
            handle.write(json_text.dumps(sample) + "\n")


def read_cpu_trace(paths: "RunPaths") -> List[dict]:
    if not paths.cpu_trace.is_file():
        return []
    samples = []
    for line in paths.cpu_trace.read_text(encoding="utf-8").splitlines():
        try:
            samples.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill
    return samples


def _trace_processes(samples: Sequence[dict], starts: Optional[Sequence[dict]] = None) -> List[tuple]:
    """The samples of each training process, in order: ``[(from_update, [(update, seconds)])]``.

    Older traces (``{"update", "cpu_seconds"}`` lines) do not name the process: a new one is
    where the CPU seconds fall, its ``from_update`` is taken from the training log's process
    starts (the first ones: the named processes came later) when their numbers agree (else
    unknown: None), and a process's first samples that still carry the update its predecessor
    logged last (an update later than one it logs afterwards) are dropped."""
    processes, legacy = [], []
    for sample in samples:
        if "process_cpu_seconds" in sample:
            key = (sample["pid"], sample["from_update"])
            if not processes or processes[-1][0] != key:
                processes.append((key, []))
            processes[-1][1].append((sample["update"], sample["process_cpu_seconds"]))
        else:
            if not legacy or sample["cpu_seconds"] < legacy[-1][-1][1]:
                legacy.append([])
            legacy[-1].append((sample["update"], sample["cpu_seconds"]))
    # older lines come first: the log's first starts are theirs, its last ones the named processes'
    starts = list(starts or [])[:max(0, len(starts or []) - len(processes))]
    result = []
    for i, points in enumerate(legacy):
        kept = [p for j, p in enumerate(points) if all(p[0] <= q[0] for q in points[j + 1:])]
        result.append((starts[i]["from_update"] if len(starts) == len(legacy) else None, kept))
    return result + [(key[1], points) for key, points in processes]


def cpu_cost_path(samples: Sequence[dict], starts: Optional[Sequence[dict]] = None) -> List[tuple]:
    """``[(update, training CPU seconds to reach it)]`` along the run's surviving path: a
    process resumed from update U continues from the CPU seconds at U, so updates that an
    interrupted process trained past its last checkpoint (trained again after the resume) and
    the CPU time of runners killed without recording it are counted once, as in one
    uninterrupted training. ``starts``: :func:`parse_training_log`'s, for older traces."""
    path: List[tuple] = []
    for from_update, points in _trace_processes(samples, starts):
        if from_update is None:  # unknown: continues where the path ends
            base = path[-1][1] if path else 0.0
            from_update = path[-1][0] if path else 0
        elif from_update == 0:
            base, path = 0.0, []
        else:
            base = _interpolated(path, from_update)
            base = base if base is not None else (path[-1][1] if path else 0.0)
            path = [p for p in path if p[0] < from_update] + [(from_update, base)]
        path += [(update, round(base + seconds, 1)) for update, seconds in points if update > from_update]
    return path


def _interpolated(path: Sequence[tuple], update: int) -> Optional[float]:
    """Seconds at ``update`` on ``[(update, seconds)]``: linear between the points around it, the
    first point's before it, None past the last."""
    after = next((i for i, (u, _) in enumerate(path) if u >= update), None)
    if after is None:
        return None
    (u1, s1), (u0, s0) = path[after], path[after - 1] if after > 0 else path[after]
    if u1 == u0:
        return s1
    return round(s0 + (s1 - s0) * (update - u0) / (u1 - u0), 1)


def cpu_seconds_at(samples: Sequence[dict], update: int, starts: Optional[Sequence[dict]] = None) -> Optional[float]:
    """The training CPU seconds when ``update`` was reached (:func:`cpu_cost_path`), linear
    between the samples around it (they are ``CpuTrace.interval`` apart, or further while the
    runner evaluates another run); the first sample's before it, None past the last sample."""
    return _interpolated(cpu_cost_path(samples, starts), update)


def stopping_epoch(curve: Sequence[dict], patience: int) -> Optional[int]:
    """The epoch at which ``--patience`` stops a run with this validation history
    (``[{"epoch", "valid_loss"}]``, in order), by fairseq's rule: ``patience`` validations in
    a row that do not improve on the best (lower) loss; None if it never does."""
    if patience <= 0:
        return None
    return next((point["epoch"] for point, without in _patience_counts(curve) if without >= patience), None)


def _patience_counts(curve: Sequence[dict]):
    """``(point, n)`` for each validation: n of them in a row, ending there, have not improved on the
    best (lower) loss before them (fairseq's ``--patience`` count after that validation)."""
    best, without = None, 0
    for point in curve:
        if best is None or point["valid_loss"] < best:
            best, without = point["valid_loss"], 0
        else:
            without += 1
        yield point, without


#: how often the runner reads a running training's log for :func:`stopping_epoch`
CONVERGENCE_CHECK_SECONDS = 30.0

#: the runner's progress lines: ``[experiments] ...``
log = functools.partial(lab_log, stage="experiments")


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def train_log(self) -> Path:
        return self.root / "train.log"

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    @property
    def record(self) -> Path:
        return self.root / "run.json"

    @property
    def cpu_trace(self) -> Path:
        """``{"update", "cpu_seconds"}`` lines sampled while training (:class:`CpuTrace`)."""
        return self.root / "cpu_trace.jsonl"


def run_paths(output: Path, run: Run) -> RunPaths:
    return RunPaths(Path(output) / run.name)


def read_record(paths: RunPaths) -> dict:
    if paths.record.is_file():
        return json.loads(paths.record.read_text(encoding="utf-8"))
    return {}


def write_text_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that a reader, or a process killed at any moment, sees
    the old file or the new one, never a part (a synced temporary file, then a rename)."""
    with replacing(path, sync=True) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_record(paths: RunPaths, record: dict) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    write_text_atomically(paths.record, json_text.dumps(record, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------- fairseq's log
def _number(value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value
    return int(number) if number.is_integer() and "." not in str(value) else number


def parse_training_log(text: str) -> dict:
    """Epoch records from a fairseq JSON log (``--log-format json``).

    Returns ``{"epochs": [{"epoch", "num_updates", "valid_loss", "seconds", "wps"}], "last":
    {latest train_inner record}, "starts": [{"from_update", "reached"}], "done": bool}``;
    ``seconds`` is fairseq's wall clock of the training, ``wps`` its target tokens per
    second. A resumed run's clock starts again at 0 in the log; the seconds here continue
    from the earlier processes' time. ``starts``: one per training process, the update it
    started from (its checkpoint's, 0 from scratch) and the highest update it logged.
    """
    epochs: Dict[int, dict] = {}
    last = {}
    starts: List[dict] = []
    offset, previous = 0.0, 0.0  # seconds of the earlier processes; the last train_wall seen
    for line in text.splitlines():
        loaded = _LOG_LOADED.search(line)
        if loaded or _LOG_FRESH.search(line):
            starts.append({"from_update": int(loaded.group(1)) if loaded else 0, "reached": None})
            continue
        match = _LOG_RECORD.search(line)
        if not match:
            continue
        kind = match.group(1)
        try:
            record = {k: _number(v) for k, v in json.loads(match.group(2)).items()}
        except json.JSONDecodeError:
            continue
        update = next((record[k] for k in _UPDATE_KEYS if isinstance(record.get(k), int)), None)
        if update is not None:
            if not starts:
                starts.append({"from_update": 0, "reached": None})
            starts[-1]["reached"] = max(update, starts[-1]["reached"] or 0)
        if kind == "train_inner":
            last = record
            continue
        epoch = int(record.get("epoch", 0))
        entry = epochs.setdefault(epoch, {"epoch": epoch})
        if kind == "valid":
            entry["valid_loss"] = record.get("valid_loss")
            entry["num_updates"] = record.get("valid_num_updates")
        else:
            wall = record.get("train_wall")
            if isinstance(wall, (int, float)):
                if wall < previous:
                    offset += previous
                previous = wall
                wall += offset
            entry["seconds"] = wall
            entry["wps"] = record.get("train_wps")
            entry.setdefault("num_updates", record.get("train_num_updates"))
    ordered = [epochs[e] for e in sorted(epochs)]
    return {"epochs": ordered, "last": last, "starts": starts, "done": "done training" in text}


def repeated_updates(starts: Sequence[dict]) -> int:
    """Updates trained more than once across a run's processes: a process that starts from
    a checkpoint older than the updates logged before trains those again. A lower bound,
    since fairseq logs the update count every ``--log-interval`` updates and at epoch ends."""
    repeated, highest = 0, 0
    for start in starts:
        reached = start["reached"] if start["reached"] is not None else start["from_update"]
        repeated += max(0, min(reached, highest) - start["from_update"])
        highest = max(highest, reached)
    return repeated


def training_summary(parsed: dict, patience: int = 0) -> dict:
    """Best valid loss, when it was reached (update, seconds), the training speed, and how
    many training processes the run took (``starts``) with the updates they repeated.

    With ``patience``, the run counts up to the epoch at which ``--patience`` stops it
    (:func:`stopping_epoch`, ``stopped_at_epoch``): a run trained past it (resumed by a fairseq
    that lost the count) is cut there, its last epoch kept as ``epochs_trained``."""
    validated = [e for e in parsed["epochs"] if isinstance(e.get("valid_loss"), (int, float))]
    stop = stopping_epoch(validated, patience)
    counted = [e for e in parsed["epochs"] if stop is None or e["epoch"] <= stop]
    epochs = [e for e in validated if stop is None or e["epoch"] <= stop]
    summary = {"epochs": len(counted), "curve": [
        {"epoch": e["epoch"], "update": e.get("num_updates"), "seconds": e.get("seconds"), "valid_loss": e["valid_loss"]}
        for e in epochs
    ]}
    if stop is not None:
        summary["stopped_at_epoch"] = stop
        if parsed["epochs"][-1]["epoch"] > stop:
            summary["epochs_trained"] = parsed["epochs"][-1]["epoch"]
    if epochs:
        best = min(epochs, key=lambda e: e["valid_loss"])
        summary.update(best_valid_loss=best["valid_loss"], best_epoch=best["epoch"],
                       best_update=best.get("num_updates"), seconds_to_best=best.get("seconds"))
        summary["updates"] = counted[-1].get("num_updates")
        summary["seconds"] = counted[-1].get("seconds")
    speeds = [e["wps"] for e in counted if isinstance(e.get("wps"), (int, float))]
    if speeds:
        summary["train_tokens_per_second"] = statistics.median(speeds)
    starts = parsed.get("starts") or []
    summary["starts"] = max(1, len(starts))
    summary["repeated_updates"] = repeated_updates(starts)
    return summary


def read_training(paths: "RunPaths") -> Tuple[dict, Optional[List[tuple]]]:
    """The run's training log parsed (:func:`parse_training_log`) and, when it kept a CPU
    trace, its cost path (:func:`cpu_cost_path`; None without a trace)."""
    text = paths.train_log.read_text(encoding="utf-8", errors="replace") if paths.train_log.is_file() else ""
    parsed = parse_training_log(text)
    samples = read_cpu_trace(paths)
    return parsed, cpu_cost_path(samples, parsed["starts"]) if samples else None


def summarise_training(experiment: Experiment, paths: "RunPaths", record: dict,
                       training: Optional[Tuple[dict, Optional[List[tuple]]]] = None) -> dict:
    """``record["train"]`` from the training log (:func:`training_summary`). A run trained by
    more than one process, or cut at its stopping epoch, gets ``cpu_seconds`` from the CPU
    trace (kept with ``eval.curve``) along the path of its checkpoints (:func:`cpu_cost_path`;
    None where the trace does not reach); otherwise the table reads the reaped CPU time of its
    processes (``record["train_cpu_seconds"]``). ``training``: :func:`read_training`'s, if read."""
    parsed, path = training or read_training(paths)
    summary = training_summary(parsed, experiment.schedule.patience)
    resumed_or_cut = summary["starts"] > 1 or "epochs_trained" in summary
    if path is not None and summary.get("updates") is not None and resumed_or_cut:
        summary["cpu_seconds"] = _interpolated(path, summary["updates"])
        if summary["cpu_seconds"] is None and path:  # the trace stops short: what it does measure
            summary["cpu_traced_to"] = {"update": path[-1][0], "seconds": path[-1][1]}
    return summary


def converged_by_log(experiment: Experiment, paths: "RunPaths") -> Optional[int]:
    """The epoch at which the run's validation history already meets ``--patience``
    (:func:`stopping_epoch`), None if it does not (or the file sets no patience)."""
    if not experiment.schedule.patience or not paths.train_log.is_file():
        return None
    parsed = parse_training_log(paths.train_log.read_text(encoding="utf-8", errors="replace"))
    return training_summary(parsed, experiment.schedule.patience).get("stopped_at_epoch")


# ---------------------------------------------------------------- commands
def check_data(experiment: Experiment, data) -> None:
    """Fail before any training if ``data`` cannot serve the experiment: not a data-bin, no
    training or validation split, or a subset the evaluation scores that it lacks.

    Raises ``ExperimentError`` naming the folder and what is missing.
    """
    from ..evaluation.evaluate import data_bin_metadata

    try:
        meta = data_bin_metadata(data)
    except (OSError, ValueError) as exc:
        raise ExperimentError(f"--data: {exc}") from None
    pair = f"{meta['source_lang']}-{meta['target_lang']}"
    missing = [split for split in ("train", "valid")
               if not (Path(data) / f"{split}.{pair}.{meta['source_lang']}.idx").is_file()]
    if missing:
        raise ExperimentError(f"--data: {data} has no {' or '.join(missing)} split ({pair})")
    wanted = dict.fromkeys([*experiment.evaluation.subsets, *experiment.evaluation.curve_subsets])
    unknown = [s for s in wanted if s not in meta["subsets"]]
    if unknown:
        raise ExperimentError(f"{experiment.path}: eval.subsets {unknown} are not in the data-bin {data}"
                              f" (it has {sorted(meta['subsets'])})")


#: what a dry run prints in place of an uptrained row's model options (known after conversion)
UPTRAINED_MODEL_PLACEHOLDER = "<the model options sret-uptrain prints>"


def train_command(experiment: Experiment, run: Run, data: str, paths: RunPaths, cpu: bool = False,
                  max_update: Optional[int] = None, max_epoch: Optional[int] = None,
                  model_options: Optional[List[str]] = None) -> List[str]:
    """The fairseq-train command of ``run`` (the schedule's flags, then the row's). An
    uptrained row's model is ``model_options`` (sret-uptrain's ``--arch sret_transformer ...``),
    fine-tuned from :func:`uptrained_checkpoint`."""
    schedule = experiment.schedule
    keep = last_epochs_averaged(experiment)
    if run.row.uptrain_from:
        model = [*(model_options or [UPTRAINED_MODEL_PLACEHOLDER]),
                 "--finetune-from-model", str(uptrained_checkpoint(paths))]
    else:
        model = ["--arch", run.row.arch]
    cmd = [
        sys.executable, "-m", "fairseq_cli.train", str(data), "--user-dir", str(USER_DIR),
        *model, *schedule.args, *run.row.args,
        "--seed", str(run.seed), "--save-dir", str(paths.checkpoints),
        "--log-format", "json", "--log-interval", "50", "--no-progress-bar",
    ]
    if not experiment.evaluation.curve_every:
        cmd += ["--keep-last-epochs", str(keep)]  # with a curve, every epoch's is kept until it is read
    if max_update is None:
        max_update = run.row.max_update or schedule.max_update
    max_epoch = schedule.max_epoch if max_epoch is None else max_epoch
    if max_update:
        cmd += ["--max-update", str(max_update)]
    if max_epoch:
        cmd += ["--max-epoch", str(max_epoch)]
    if schedule.patience:
        cmd += ["--patience", str(schedule.patience)]
    if cpu:
        cmd += ["--cpu"]
    return cmd


def last_epochs_averaged(experiment: Experiment) -> int:
    """The most epoch checkpoints a ``lastN`` evaluation averages (1 if none)."""
    return max([int(m.group(1)) for m in map(AVERAGE.fullmatch, experiment.evaluation.checkpoints)
                if m and not m.group(2)] or [1])


def portable(args: Sequence[str]) -> List[str]:
    """``args`` as recorded in results: absolute paths inside the working folder made relative
    to it (the results travel to other machines; their folders mean nothing there)."""
    here = Path.cwd()
    out = []
    for arg in args:
        path = Path(arg)
        if path.is_absolute() and path.is_relative_to(here):
            arg = str(path.relative_to(here)) or "."
        out.append(arg)
    return out


def uptrained_checkpoint(paths: RunPaths) -> Path:
    """Where an uptrained run keeps its converted starting point."""
    return paths.root / "uptrained.pt"


def teacher_paths(output, run: Run) -> RunPaths:
    """The run an uptrained ``run`` starts from: its ``uptrain_from`` row, the same seed."""
    return RunPaths(Path(output) / run.teacher_name)


def convert_teacher(output, run: Run, paths: RunPaths, env: Optional[dict] = None) -> List[str]:
    """Convert the teacher run's ``checkpoint_last.pt`` with ``sret-uptrain`` (the row's
    ``uptrain_args``, the run's seed) into :func:`uptrained_checkpoint`; returns the model
    options it prints. Raises ExperimentError, with sret-uptrain's message, when it fails."""
    teacher = teacher_paths(output, run)
    source = teacher.checkpoints / "checkpoint_last.pt"
    status = read_record(teacher).get("status")
    if status != "done":
        raise ExperimentError(
            f"{run.name} starts from {run.teacher_name}, which is not done in {teacher.root}"
            f" (status {status or 'none'}): train it first in this output folder"
        )
    if not source.is_file():
        raise ExperimentError(
            f"{run.name} starts from {run.teacher_name}, whose {source} is missing:"
            f" train that run first in this output folder (a results file holds no checkpoints)"
        )
    cmd = [sys.executable, "-m", "fairseq_sret_cli.uptrain", str(source), str(uptrained_checkpoint(paths)),
           *run.row.uptrain_args, "--seed", str(run.seed), "--force"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        message = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExperimentError(f"{run.name}: sret-uptrain failed (exit {proc.returncode}): {message}")
    return shlex.split(lines[-1])


def run_config(experiment: Experiment, run: Run, max_update: Optional[int] = None,
               max_epoch: Optional[int] = None) -> dict:
    """What makes a run's numbers: a recorded run counts as done only for the same config."""
    schedule = experiment.schedule
    config = {
        "arch": run.row.arch, "args": [*schedule.args, *run.row.args], "seed": run.seed,
        "variants": run.row.variants,
        "max_update": (run.row.max_update or schedule.max_update) if max_update is None else max_update,
        "max_epoch": schedule.max_epoch if max_epoch is None else max_epoch, "patience": schedule.patience,
        "eval": {"beam": experiment.evaluation.beam, "lenpen": experiment.evaluation.lenpen,
                 "subsets": list(experiment.evaluation.subsets), "checkpoints": list(experiment.evaluation.checkpoints),
                 "variants": dict(experiment.evaluation.variants)},
    }
    if experiment.evaluation.curve_every:
        config["eval"]["curve"] = {"every": experiment.evaluation.curve_every,
                                   "subsets": list(experiment.evaluation.curve_subsets)}
    if run.row.uptrain_from:
        config["uptrain"] = {"from": run.row.uptrain_from, "args": list(run.row.uptrain_args)}
    return config


def finished_record(experiment: Experiment, run: Run, output, known: Optional[Dict[str, dict]] = None,
                    max_update: Optional[int] = None, max_epoch: Optional[int] = None) -> Optional[dict]:
    """The run's record if it is done with today's config: in its run folder, or among
    ``known`` records (the results file of earlier sessions, keyed by run name)."""
    config = run_config(experiment, run, max_update, max_epoch)
    for record in (read_record(run_paths(output, run)), (known or {}).get(run.name) or {}):
        if record.get("status") == "done" and record.get("config") == config:
            return dict(record, row=run.row.id, seed=run.seed)
    return None


# ---------------------------------------------------------------- a run folder's settings
class SettingsChanged(ExperimentError):
    """Run folders trained with other settings than the experiment file now gives them."""


#: options whose values locate a run's files rather than decide its numbers (and --cpu: a run may
#: continue on another machine)
_LOCATING = {"--user-dir": "<user-dir>", "--save-dir": "<run>/checkpoints", "--finetune-from-model": "<run>/uptrained.pt"}


def training_settings(command: Sequence[str]) -> List[str]:
    """A fairseq-train command (``[python,] -m fairseq_cli.train DATA ...``, as :func:`train_command`
    makes it or ``run.json`` records it) as the settings that decide the model: the data-bin
    and the paths of the run's files become placeholders, ``--cpu`` is left out."""
    args = list(command)
    args = args[args.index("fairseq_cli.train") + 2:] if "fairseq_cli.train" in args else args[1:]
    out, located = ["<data>"], None
    for arg in args:
        if located is not None:
            out.append(located)
            located = None
        elif arg in _LOCATING:
            out.append(arg)
            located = _LOCATING[arg]
        elif arg != "--cpu":
            out.append(arg)
    return out


def settings_fingerprint(settings: Sequence[str]) -> str:
    return hashlib.sha256(json_text.dumps(list(settings)).encode("utf-8")).hexdigest()[:16]


def _options(settings: Sequence[str]) -> Dict[str, str]:
    found, flag = {}, None
    for arg in settings:
        if arg.startswith("--"):
            flag = arg
            found[flag] = ""
        elif flag is not None:
            found[flag] = (found[flag] + " " + arg).strip()
    return found


def settings_difference(old: Sequence[str], new: Sequence[str]) -> str:
    """``--lr 0.001 -> 0.0005; --dropout 0.3 added`` (the options whose values differ)."""
    a, b = _options(old), _options(new)
    parts = []
    for flag in list(a) + [f for f in b if f not in a]:
        if flag not in b:
            parts.append(f"{flag} {a[flag]} removed".replace("  ", " "))
        elif flag not in a:
            parts.append(f"{flag} {b[flag]} added".replace("  ", " "))
        elif a[flag] != b[flag]:
            parts.append(f"{flag} {a[flag]} -> {b[flag]}")
    return "; ".join(parts) or "the options' order or positional arguments differ"


#: what the runner makes in a run folder (``--force`` on a changed run removes exactly these)
RUN_OUTPUTS = ("checkpoints", "train.log", "eval", "run.json", "cpu_trace.jsonl", "uptrained.pt")


def recorded_settings(paths: RunPaths, record: dict) -> Optional[List[str]]:
    """The settings a run folder's training used (``run.json``), None if it records none."""
    if record.get("train_settings"):
        return list(record["train_settings"])
    if record.get("command"):  # recorded before the settings were
        return training_settings(record["command"])
    return None


def trained_anything(paths: RunPaths) -> bool:
    return paths.checkpoints.is_dir() and any(paths.checkpoints.iterdir())


def check_run_folder(run: Run, paths: RunPaths, settings: List[str], force: bool = False) -> Optional[str]:
    """Bind ``run``'s folder to ``settings``: None when it is empty, or trained with these
    settings (it resumes); else what differs. With ``force`` a folder trained otherwise is
    emptied of what the runner made there (said loudly) and None returned."""
    record = read_record(paths)
    if not trained_anything(paths) and not paths.train_log.exists():
        return None
    recorded = recorded_settings(paths, record)
    if recorded == settings:
        return None
    why = (f"{run.name}: {paths.root} holds checkpoints that sret-experiments did not record (no run.json)"
           if recorded is None else
           f"{run.name} was trained in {paths.root} with other settings ({settings_difference(recorded, settings)})")
    if not force:
        return why
    log(f"{why}: --force: training it again from scratch (its checkpoints, log and evaluations are replaced)")
    for name in RUN_OUTPUTS:
        target = paths.root / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif os.path.lexists(target):
            target.unlink()
    return None


def run_settings(experiment: Experiment, run: Run, data: str, output, cpu: bool, max_update, max_epoch,
                 model_options: Optional[List[str]]) -> List[str]:
    """The training settings of ``run``; an uptrained run's include its teacher's (the teacher
    row's, or when the row is not selected, those its run folder records)."""
    paths = run_paths(output, run)
    settings = training_settings(train_command(experiment, run, data, paths, cpu=cpu, max_update=max_update,
                                               max_epoch=max_epoch, model_options=model_options))
    if run.row.uptrain_from:
        row = next((r for r in experiment.rows if r.id == run.row.uptrain_from), None)
        if row is not None:
            teacher = run_settings(experiment, Run(row, run.seed), data, output, cpu, max_update, max_epoch, None)
        else:
            teacher = read_record(teacher_paths(output, run)).get("train_settings") or ["<not recorded>"]
        settings += ["<teacher>", *teacher]
    return settings


def model_facts(checkpoint) -> dict:
    """Unique parameters and layer applications of a fairseq checkpoint.

    Tied tensors (shared embeddings) are stored once in the file and counted once, as are
    shared layers (they are one set of parameters); buffers are not counted.
    """
    from fairseq_sret.checkpoints import load_checkpoint

    state = load_checkpoint(checkpoint)
    seen, params = set(), 0
    for name, tensor in state["model"].items():
        if name.endswith(("._float_tensor", ".version")) or not tensor.is_floating_point():
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            params += tensor.numel()
    cfg = (state.get("cfg") or {}).get("model") or state.get("args")
    get = (lambda k, d=None: getattr(cfg, k, d)) if not isinstance(cfg, dict) else (lambda k, d=None: cfg.get(k, d))
    encoder = (get("encoder_layers") or 0) * (get("encoder_recursions", 1) or 1)
    decoder = (get("decoder_layers") or 0) * (get("decoder_recursions", 1) or 1)
    return {"params": params, "applications": f"{encoder}+{decoder}", "arch": get("arch")}


class NothingToAverage(RuntimeError):
    """A ``lastN`` evaluation of a run that saved no checkpoint of that kind (a short run)."""


def _checkpoint_for(kind: str, paths: RunPaths, train: Optional[dict] = None) -> Path:
    """The checkpoint file of ``kind`` (``best``, ``last``, ``lastN``: averaged here once).
    ``train``: the run's summary; a run trained past the epoch at which ``--patience`` stops it
    is read as of that epoch: ``best`` its best epoch's checkpoint, ``lastN`` the N epoch
    checkpoints ending there, ``last`` that epoch's."""
    from fairseq_sret.checkpoints import average_checkpoints, last_n_checkpoints, save_checkpoint

    until = (train or {}).get("stopped_at_epoch") if (train or {}).get("epochs_trained") else None
    if until is not None and kind in ("best", "last"):
        return paths.checkpoints / f"checkpoint{train['best_epoch'] if kind == 'best' else until}.pt"
    if kind in CHECKPOINT_KINDS:
        return paths.checkpoints / CHECKPOINT_KINDS[kind]
    match = AVERAGE.fullmatch(kind)
    n, by = int(match.group(1)), "update" if match.group(2) else "epoch"
    if by == "update":
        until = None  # update checkpoints are not cut
    target = paths.checkpoints / (f"checkpoint.{kind}.pt" if until is None else f"checkpoint.{kind}.to{until}.pt")
    if not target.is_file():
        pattern = "checkpoint_*_*.pt" if by == "update" else "checkpoint[0-9]*.pt"
        found = [p for p in paths.checkpoints.glob(pattern)
                 if until is None or int(p.stem[len("checkpoint"):]) <= until]
        available = len(found)
        if available == 0:
            hint = "--save-interval-updates" if by == "update" else "a longer run (one per epoch)"
            raise NothingToAverage(f"no {by} checkpoints in {paths.checkpoints} to average for '{kind}' ({hint})")
        if available < n:
            log(f"{paths.root}: only {available} {by} checkpoints for '{kind}'; averaging those")
        save_checkpoint(average_checkpoints(last_n_checkpoints(paths.checkpoints, min(n, available), by=by,
                                                               upper_bound=until)), target)
    return target


def evaluation_key(kind: str, variant: str) -> str:
    """``best`` (as trained) or ``best@depth1`` (with a variant's generate flags)."""
    return f"{kind}@{variant}" if variant else kind


def evaluate_run(experiment: Experiment, paths: RunPaths, data: str, cpu: bool = False,
                 row: Optional[Row] = None, skipped: Optional[Dict[str, str]] = None,
                 train: Optional[dict] = None) -> dict:
    """Scores and generation speed of every checkpoint kind (and variant) on every subset:
    ``{key: {subset: result}}`` with keys from :func:`evaluation_key`.

    A ``lastN`` kind with no checkpoint to average is left out, its reason put in ``skipped``.
    """
    from ..evaluation.evaluate import evaluate

    ev = experiment.evaluation
    results: Dict[str, Dict[str, dict]] = {}
    for kind in ev.checkpoints:
        try:
            checkpoint = _checkpoint_for(kind, paths, train)
        except NothingToAverage as exc:
            log(f"{paths.root}: '{kind}' not evaluated: {exc}")
            if skipped is not None:
                skipped[kind] = str(exc)
            continue
        for variant, flags in ev.variants.items():
            if row is not None and row.variants is not None and variant not in row.variants:
                continue
            key = evaluation_key(kind, variant)
            for subset in ev.subsets:
                report = evaluate(data, checkpoint=checkpoint, subset=subset, output_dir=paths.eval_dir / key,
                                  beam=ev.beam, lenpen=ev.lenpen, max_tokens=ev.max_tokens, cpu=cpu,
                                  extra_args=flags)
                results.setdefault(key, {})[subset] = {
                    "subset_name": report["subset_name"], "sentences": report["sentences"],
                    "scores": report["scores"], "speed": report.get("speed"), "generate_args": flags,
                }
    return results


def evaluate_curve(experiment: Experiment, paths: RunPaths, data: str, record: dict, cpu: bool = False) -> List[dict]:
    """BLEU against training CPU time: every ``curve_every``-th epoch checkpoint (and the
    last counted epoch's: :func:`training_summary`) decoded like the table on
    ``curve_subsets``. Each point is
    ``{"epoch", "update", "cpu_seconds", "valid_loss", "eval": {subset: result}}``, kept in
    ``record["curve"]`` as it is made (a rerun continues). Then the epoch checkpoints that
    neither the curve nor a ``lastN`` average needs are deleted."""
    from ..evaluation.evaluate import evaluate

    ev = experiment.evaluation
    epochs = {e["epoch"]: e for e in record.get("train", {}).get("curve", [])}
    until = record.get("train", {}).get("stopped_at_epoch")
    saved = sorted(int(p.stem[len("checkpoint"):]) for p in paths.checkpoints.glob("checkpoint[0-9]*.pt"))
    counted = [e for e in saved if until is None or e <= until]
    wanted = [e for e in counted if e % ev.curve_every == 0 or e == counted[-1]]
    _, path = read_training(paths)
    points = {p["epoch"]: p for p in record.get("curve", [])}
    for epoch in wanted:
        if epoch in points or epoch not in epochs:
            continue
        update = epochs[epoch]["update"]
        point = {"epoch": epoch, "update": update, "cpu_seconds": _interpolated(path or [], update),
                 "valid_loss": epochs[epoch]["valid_loss"], "eval": {}}
        for subset in ev.curve_subsets:
            report = evaluate(data, checkpoint=paths.checkpoints / f"checkpoint{epoch}.pt", subset=subset,
                              output_dir=paths.eval_dir / "curve" / f"epoch{epoch}", beam=ev.beam, lenpen=ev.lenpen,
                              max_tokens=ev.max_tokens, cpu=cpu)
            point["eval"][subset] = {"subset_name": report["subset_name"], "scores": report["scores"]}
        points[epoch] = point
        record["curve"] = [points[e] for e in sorted(points)]
        write_record(paths, record)
    keep = set(wanted) | set(counted[-last_epochs_averaged(experiment):])
    if until is not None:  # a cut run's best and last are epoch checkpoints (:func:`_checkpoint_for`)
        keep |= {record["train"].get("best_epoch"), until}
    for epoch in saved:
        if epoch not in keep:
            (paths.checkpoints / f"checkpoint{epoch}.pt").unlink()
    return record.get("curve", [])


# ---------------------------------------------------------------- the loop
def _progress_line(run: Run, paths: RunPaths, started: float, patience: int = 0) -> str:
    """One line on a training: its update and loss, its validation loss and best, and with
    ``patience`` how many validations have not improved on the best (fairseq's count)."""
    text = paths.train_log.read_text(encoding="utf-8", errors="replace") if paths.train_log.is_file() else ""
    parsed = parse_training_log(text)
    last = parsed["last"]
    epochs = [e for e in parsed["epochs"] if "valid_loss" in e]
    parts = [f"{run.name}:"]
    if last:
        parts.append(f"epoch {last.get('epoch')}, update {last.get('num_updates')}, loss {last.get('loss')}")
    if epochs:
        parts.append(f"valid loss {epochs[-1]['valid_loss']} (best {min(e['valid_loss'] for e in epochs)})")
        if patience:
            _, without = list(_patience_counts(epochs))[-1]
            parts.append(f"{without} of --patience {patience} without improvement")
    parts.append(f"{(time.time() - started) / 60:.1f} min")
    return " ".join(parts)


def _interrupt(signum, frame):
    """SIGTERM handled as Ctrl-C: a runner stopped by ``kill`` leaves no training running."""
    raise KeyboardInterrupt(f"signal {signum}")


def run_experiment(
    experiment: Experiment,
    data: str,
    output,
    jobs: int = 1,
    cpu: bool = False,
    max_update: Optional[int] = None,
    max_epoch: Optional[int] = None,
    progress_interval: float = 60.0,
    env: Optional[dict] = None,
    on_run_done: Optional[Callable[[Run, dict], None]] = None,
    known: Optional[Dict[str, dict]] = None,
    deadline: Optional[float] = None,
    force: bool = False,
) -> List[dict]:
    """Train and evaluate every run that is not done yet; returns every run's record.

    ``known``: records of earlier sessions (run name -> record) that count as done when
    their config matches. ``deadline`` (a ``time.time()`` value): no run starts after it,
    and trainings still going then are stopped (they resume from their last checkpoint
    when the command runs again on the same output folder). A run folder trained with other
    settings (:func:`check_run_folder`) stops everything before any training
    (:class:`SettingsChanged`), or with ``force`` is trained again from scratch. Ctrl-C,
    or SIGTERM to this process, stops the trainings (they resume the same way) and raises
    ``KeyboardInterrupt``. Interrupted runs resume before new runs start, so that rows
    already begun finish first.
    """
    output = Path(output)
    pending = []
    for run in experiment.runs():
        if finished_record(experiment, run, output, known, max_update, max_epoch) is not None:
            log(f"{run.name}: done already, skipped")
        else:
            pending.append(run)
    pending.sort(key=lambda run: not trained_anything(run_paths(output, run)))  # stable: file order otherwise
    changed = []
    for run in pending:
        paths = run_paths(output, run)
        options = read_record(paths).get("uptrain", {}).get("model_options")
        settings = run_settings(experiment, run, data, output, cpu, max_update, max_epoch, options)
        changed += [problem for problem in [check_run_folder(run, paths, settings, force)] if problem]
    if changed:
        more = f"; and {len(changed) - 2} more" if len(changed) > 2 else ""
        raise SettingsChanged("; ".join(changed[:2]) + more + ": their checkpoints would give the new row's"
                              " numbers from the old model; restore the experiment file, give another --output,"
                              " or pass --force to train them again from scratch")
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    running = []  # (run, paths, process, log file, started)
    traces = {}  # run name -> CpuTrace
    failures = []
    last_progress = time.time()
    stopped = []

    def training_ended(run: Run, paths: RunPaths, handle, cpu_seconds: float) -> dict:
        """Close the ended training's log, end its CPU trace, and return its record with the
        process's CPU time added (not written yet)."""
        handle.close()
        if run.name in traces:
            traces.pop(run.name).finish(cpu_seconds)
        record = read_record(paths)
        add_cpu_seconds(record, cpu_seconds)
        return record

    def stop_trainings() -> None:
        for run, paths, process, handle, _ in running:
            process.terminate()
            _, cpu_seconds = reap(process, block=True)
            write_record(paths, training_ended(run, paths, handle, cpu_seconds))
            stopped.append(run.name)
        running.clear()

    converged = set()  # runs stopped here because their log met --patience

    def finish(run: Run, paths: RunPaths, record: dict, started: float) -> None:
        record["train"] = summarise_training(experiment, paths, record)
        log(f"{run.name}: trained in {(time.time() - started) / 60:.1f} min, best valid loss "
            f"{record['train'].get('best_valid_loss')} at update {record['train'].get('best_update')}; evaluating")
        skipped: Dict[str, str] = {}
        try:
            train = record["train"]
            best = _checkpoint_for("best", paths, train)
            record["model"] = model_facts(best)
            record["eval"] = evaluate_run(experiment, paths, data, cpu=cpu, row=run.row, skipped=skipped, train=train)
            if experiment.evaluation.curve_every:
                evaluate_curve(experiment, paths, data, record, cpu=cpu)
        except Exception as exc:  # one run's evaluation must not stop the others
            log(f"{run.name}: evaluation FAILED: {type(exc).__name__}: {exc}")
            record.update(status="failed", error=f"evaluation: {type(exc).__name__}: {exc}")
            write_record(paths, record)
            failures.append(run.name)
            return
        record.pop("error", None)
        if skipped:
            record["eval_skipped"] = skipped
        record["status"] = "done"
        write_record(paths, record)
        if on_run_done is not None:
            on_run_done(run, record)

    def stop_the_converged(now: float) -> None:
        """Stop a training whose log meets --patience (a fairseq without the patience_resume
        patch, resumed, counts again and would train on)."""
        for run, paths, process, _, _ in running:
            if run.name in converged or now - watched.get(run.name, 0.0) < CONVERGENCE_CHECK_SECONDS:
                continue
            watched[run.name] = now
            stopped_at = converged_by_log(experiment, paths)
            if stopped_at is not None and process.poll() is None:
                log(f"{run.name}: its validation loss stopped improving at epoch {stopped_at} (--patience"
                    f" {experiment.schedule.patience}); stopping the training")
                converged.add(run.name)
                process.terminate()

    watched: Dict[str, float] = {}
    handles_sigterm = threading.current_thread() is threading.main_thread()  # signals reach only that one
    if handles_sigterm:
        previous_handler = signal.signal(signal.SIGTERM, _interrupt)
    try:
        while pending or running:
            if deadline is not None and time.time() >= deadline:
                stop_trainings()
                stopped += [run.name for run in pending]
                log(f"time limit reached: {len(stopped)} runs not finished ({', '.join(stopped)});"
                    " run the same command again to continue")
                break
            while len(running) < max(1, jobs):
                # an uptrained run waits for its teacher run when that is still to finish here
                busy = {r.name for r in pending} | {item[0].name for item in running}
                run = next((r for r in pending if r.teacher_name not in busy), None)
                if run is None:
                    break
                pending.remove(run)
                paths = run_paths(output, run)
                paths.root.mkdir(parents=True, exist_ok=True)
                record = read_record(paths)
                stopped_at = converged_by_log(experiment, paths)
                if stopped_at is not None:
                    log(f"{run.name}: its validation loss stopped improving at epoch {stopped_at} (--patience"
                        f" {experiment.schedule.patience}); not trained further")
                    record.update(row=run.row.id, seed=run.seed,
                                  config=run_config(experiment, run, max_update, max_epoch))
                    finish(run, paths, record, time.time())
                    continue
                model_options = None
                if run.row.uptrain_from:
                    model_options = record.get("uptrain", {}).get("model_options")
                    if not (model_options and uptrained_checkpoint(paths).is_file()):
                        try:
                            model_options = convert_teacher(output, run, paths, env)
                        except ExperimentError as exc:
                            log(f"{run.name}: uptraining FAILED: {exc}")
                            record.update(status="failed", row=run.row.id, seed=run.seed, error=str(exc))
                            write_record(paths, record)
                            failures.append(run.name)
                            continue
                        log(f"{run.name}: converted {run.teacher_name} with sret-uptrain")
                    record["uptrain"] = {"from": run.teacher_name, "model_options": model_options}
                cmd = train_command(experiment, run, data, paths, cpu=cpu, max_update=max_update, max_epoch=max_epoch,
                                    model_options=model_options)
                settings = run_settings(experiment, run, data, output, cpu, max_update, max_epoch, model_options)
                record.update(status="training", row=run.row.id, seed=run.seed, command=portable(cmd[1:]), jobs=jobs,
                              config=run_config(experiment, run, max_update, max_epoch), train_settings=settings,
                              train_fingerprint=settings_fingerprint(settings))
                add_training_device(record, device_name(cpu))
                write_record(paths, record)
                log(f"{run.name}: training ({len(running) + 1} side by side; log {paths.train_log})")
                handle = open(paths.train_log, "a", encoding="utf-8")
                log_offset = handle.tell()
                process = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env)
                running.append((run, paths, process, handle, time.time()))
                if experiment.evaluation.curve_every:
                    traces[run.name] = CpuTrace(paths, process.pid, log_offset)
            time.sleep(0.5)
            for trace in traces.values():
                trace.poll(time.time())
            stop_the_converged(time.time())
            if progress_interval and time.time() - last_progress >= progress_interval:
                last_progress = time.time()
                for run, paths, _, _, started in running:
                    log(_progress_line(run, paths, started, experiment.schedule.patience))
            still = []
            for item in running:
                run, paths, process, handle, started = item
                returncode, cpu_seconds = reap(process)
                if returncode is None:
                    still.append(item)
                    continue
                record = training_ended(run, paths, handle, cpu_seconds)
                if process.returncode != 0 and run.name not in converged:
                    text = paths.train_log.read_text(encoding="utf-8", errors="replace")
                    tail = "\n".join(text.splitlines()[-15:])
                    log(f"{run.name}: training FAILED (exit {process.returncode}); last lines of {paths.train_log}:\n{tail}")
                    record.update(status="failed", returncode=process.returncode)
                    write_record(paths, record)
                    failures.append(run.name)
                    continue
                finish(run, paths, record, started)
            running = still
    except KeyboardInterrupt:
        stop_trainings()
        raise
    finally:
        if handles_sigterm:  # None: a handler not set from Python, i.e. the default one
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous_handler is None else previous_handler)
    if failures:
        raise RuntimeError(f"{len(failures)} runs failed: {', '.join(failures)} (the log above and their"
                           " run.json and train.log say why)")
    return collect_records(experiment, output, known, max_update, max_epoch)


def refresh_training(experiment: Experiment, output) -> List[str]:
    """Read every finished run's training again from its folder (log and CPU trace) with
    today's rules: ``record["train"]`` (:func:`summarise_training`) and each curve point's CPU
    seconds. The decoded scores stay. Returns the runs whose numbers changed."""
    changed = []
    for run in experiment.runs():
        paths = run_paths(output, run)
        record = read_record(paths)
        if record.get("status") != "done" or not paths.train_log.is_file():
            continue
        before = json_text.dumps([record.get("train"), record.get("curve")], sort_keys=True)
        training = read_training(paths)
        record["train"] = summarise_training(experiment, paths, record, training)
        for point in record.get("curve") or []:
            point["cpu_seconds"] = _interpolated(training[1] or [], point["update"])
        if json_text.dumps([record.get("train"), record.get("curve")], sort_keys=True) != before:
            write_record(paths, record)
            changed.append(run.name)
    return changed


def collect_records(experiment: Experiment, output, known: Optional[Dict[str, dict]] = None,
                    max_update: Optional[int] = None, max_epoch: Optional[int] = None) -> List[dict]:
    """Every run's record: the finished one (this session's or ``known``), else what is there."""
    records = []
    for run in experiment.runs():
        done = finished_record(experiment, run, output, known, max_update, max_epoch)
        records.append(done or dict(read_record(run_paths(output, run)), row=run.row.id, seed=run.seed))
    return records
