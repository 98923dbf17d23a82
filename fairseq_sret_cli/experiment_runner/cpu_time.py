"""The CPU time a run's training costs: each process's, reaped when it ends, a trace of it
against the updates logged (the cost of each checkpoint), and the machine it ran on
(:mod:`fairseq_sret_cli.hardware`)."""

import json
import os
import resource
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence

from fairseq_sret import json_text

from .records import TranslationRunRecord
from .run_folder import RunPaths
from .training_log import logged_update, process_start


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


def is_running(process: subprocess.Popen) -> bool:
    """Whether the child still runs, without reaping it (``Popen.poll`` would, and the CPU time
    that :func:`reap` reads at the reaping would then be lost)."""
    if process.returncode is not None:
        return False
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:  # reaped elsewhere
        return False


def add_cpu_seconds(record: TranslationRunRecord, seconds: float) -> None:
    """Add one training process's CPU time to the run's total (a resumed run has several)."""
    record.train_cpu_seconds = round((record.train_cpu_seconds or 0.0) + seconds, 1)
    record.train_processes = (record.train_processes or 0) + 1


def add_training_device(record: TranslationRunRecord, device: str) -> None:
    """Note the device a training process of the run starts on (``trained_on``, in order): a run
    resumed on another machine names both, and its CPU seconds are not one processor's."""
    if record.trained_on is None:
        record.trained_on = []
    if device not in record.trained_on:
        record.trained_on.append(device)


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

    def __init__(self, paths: RunPaths, pid: int, log_offset: int = 0, interval: float = 30.0):
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
            start = process_start(line)
            if start is not None:
                self.from_update = start
                continue
            update = logged_update(line)
            if update is not None:
                self.update = update

    def _write(self, seconds: Optional[float]) -> None:
        if self.update is None or seconds is None:
            return
        sample = {"pid": self.pid, "from_update": self.from_update, "update": self.update,
                  "process_cpu_seconds": round(seconds, 1)}
        with open(self.paths.cpu_trace, "a", encoding="utf-8") as handle:
            handle.write(json_text.dumps(sample) + "\n")


def read_cpu_trace(paths: RunPaths) -> List[dict]:
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
    uninterrupted training. ``starts``: :func:`~.training_log.parse_training_log`'s, for older traces."""
    path: List[tuple] = []
    for from_update, points in _trace_processes(samples, starts):
        if from_update is None:  # unknown: continues where the path ends
            base = path[-1][1] if path else 0.0
            from_update = path[-1][0] if path else 0
        elif from_update == 0:
            base, path = 0.0, []
        else:
            base = seconds_on_path(path, from_update)
            base = base if base is not None else (path[-1][1] if path else 0.0)
            path = [p for p in path if p[0] < from_update] + [(from_update, base)]
        path += [(update, round(base + seconds, 1)) for update, seconds in points if update > from_update]
    return path


def seconds_on_path(path: Sequence[tuple], update: int) -> Optional[float]:
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
    return seconds_on_path(cpu_cost_path(samples, starts), update)
