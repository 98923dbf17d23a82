"""Experiment files of image classifiers (``kind: vision``): every row x seed trained with
``sret-train-cifar``, resumed where it stopped, and reported as a table.

    kind: vision
    name: cifar10_ladder
    title: "CIFAR-10: the paper's ablation ladder"
    data: data/cifar10                     # default for --data (an ImageFolder or a torchvision download)
    seeds: [1, 2]
    max_seeds: 3                           # optional: the most seeds a row gets (close pairs then stay open)
    train:
      args: --epochs 40 --batch-size 128 --threads 1 --model-ema   # sret-train-cifar's options
    rows:
      - id: sret
        title: "SReT (conv stem, NLL, LRC, sliced groups)"
        model: sret_cifar
        args: ""                           # this row's own options (e.g. --model-kwargs nll=False)
        seeds: [1, 2, 3]

A run's folder is ``OUTPUT/<row>/seed<N>``: a run whose ``result.json`` has the settings the
file asks for and the data fingerprints of ``--data`` is done (a result of other settings or
other data counts as missing, and its run is given to the training command, which refuses
it); one with a ``checkpoint_last.pt`` is continued (``--resume``, which also tests a run
trained but not tested); the training command itself refuses a folder trained with other
settings or other data. A run the results file (``RESULTS/NAME.json``, of an earlier machine)
records as done counts as done too, on the same condition (:class:`DataCheck`, the check every
reuse goes through): a clone with the committed results trains only what is missing. A report
never drops a recorded run: one that does not serve here stays in the results file as recorded
and is listed, with why, below the table. Row ids and the experiment's name are plain names;
``--rows`` and ``--seeds`` that select no run are refused.
"""

import json
import shlex
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Dict, List, Optional, Sequence

from .. import UserError
from .experiment_file import ExperimentError, plain_name, select_rows
from .records import ImageRunRecord
from .report import done_runs, seconds_by_epoch
from .scheduler import ProcessScheduler, log

#: options the runner sets for each run: a row may not give them
RUNNER_OPTIONS = ("--data-dir", "--output", "--seed", "--resume", "--force", "--no-save", "--model")


@dataclass(frozen=True)
class ImageRow:
    id: str
    title: str
    model: str
    args: List[str]
    seeds: List[int]


@dataclass(frozen=True)
class ImageExperiment:
    name: str
    title: str
    data: Optional[str]
    args: List[str]
    rows: List[ImageRow]
    notes: str = ""
    path: str = ""
    max_seeds: Optional[int] = None

    def runs(self, rows: Optional[Sequence[str]] = None, seeds: Optional[Sequence[int]] = None) -> List[tuple]:
        """(row, seed) of every run, each row's first seed first: a table fills row by row, then seed by seed.
        ``rows`` and ``seeds`` select among them; ExperimentError for a row id or a seed that selects nothing."""
        selected = select_rows(self.rows, rows, self.path)
        if seeds is not None:
            unknown = sorted(set(seeds) - {seed for row in selected for seed in row.seeds})
            if unknown or not seeds:
                raise ExperimentError(f"{self.path}: no selected row has the seeds {unknown}; their seeds:"
                                      f" {sorted({seed for row in selected for seed in row.seeds})}")
        chosen = [(k, r, row, seed) for r, row in enumerate(self.rows) if row in selected
                  for k, seed in enumerate(row.seeds) if seeds is None or seed in seeds]
        return [(row, seed) for _, _, row, seed in sorted(chosen, key=lambda c: c[:2])]


def _args(value, where: str) -> List[str]:
    if value is None:
        return []
    if not isinstance(value, str):
        raise ExperimentError(f"{where}: expected a string of options, got {value!r}")
    args = shlex.split(value)
    for arg in args:
        if arg.split("=")[0] in RUNNER_OPTIONS:
            raise ExperimentError(f"{where}: {arg.split('=')[0]} is set by the runner for every run (row id, seed,"
                                  " data, output folder); remove it")
    return args


def parse_image_experiment(raw: dict, path) -> ImageExperiment:
    known = {"kind", "name", "title", "data", "seeds", "max_seeds", "train", "rows", "notes"}
    unknown = set(raw) - known
    if unknown:
        raise ExperimentError(f"{path}: unknown fields {sorted(unknown)} (a vision experiment has {sorted(known)})")
    if not raw.get("name"):
        raise ExperimentError(f"{path}: 'name' is required")
    name = plain_name(raw["name"], f"{path}: name")
    seeds = raw.get("seeds", [1])
    max_seeds = raw.get("max_seeds")
    if max_seeds is not None and (type(max_seeds) is not int or max_seeds < 2):
        raise ExperimentError(f"{path}: max_seeds must be an integer of 2 or more, got {max_seeds!r}")
    train = raw.get("train") or {}
    if not isinstance(train, dict) or set(train) - {"args"}:
        raise ExperimentError(f"{path}: 'train' takes only 'args'")
    rows, ids = [], set()
    for i, row in enumerate(raw.get("rows") or []):
        where = f"{path}: rows[{i}]"
        if not isinstance(row, dict) or "id" not in row or "model" not in row:
            raise ExperimentError(f"{where}: a row needs an 'id' and a 'model'")
        unknown_fields = sorted(set(row) - {"id", "title", "model", "args", "seeds"})
        if unknown_fields:
            raise ExperimentError(f"{where}: unknown fields {unknown_fields}")
        row_id = plain_name(row["id"], f"{where}: id")
        if row_id in ids:
            raise ExperimentError(f"{where}: id {row_id!r} appears twice")
        ids.add(row_id)
        row_seeds = row.get("seeds", seeds)
        integers = isinstance(row_seeds, list) and all(type(s) is int for s in row_seeds)
        if not integers or len(set(row_seeds)) != len(row_seeds):
            raise ExperimentError(f"{where}: seeds must be a list of distinct integers, got {row_seeds!r}")
        if max_seeds is not None and len(row_seeds) > max_seeds:
            raise ExperimentError(f"{where}: {len(row_seeds)} seeds, more than max_seeds ({max_seeds})")
        rows.append(ImageRow(row_id, str(row.get("title", row_id)), str(row["model"]),
                             _args(row.get("args"), f"{where}.args"), list(row_seeds)))
    if not rows:
        raise ExperimentError(f"{path}: no rows")
    return ImageExperiment(name, str(raw.get("title", name)), raw.get("data"),
                           _args(train.get("args"), f"{path}: train.args"), rows, str(raw.get("notes", "")), str(path),
                           max_seeds)


def run_folder(output: Path, row: ImageRow, seed: int) -> Path:
    return Path(output) / row.id / f"seed{seed}"


def train_command(experiment: ImageExperiment, row: ImageRow, seed: int, data: str, folder: Path) -> List[str]:
    command = [sys.executable, "-m", "fairseq_sret_cli.train_cifar", "--data-dir", str(data), "--model", row.model,
               *experiment.args, *row.args, "--seed", str(seed), "--output", str(folder)]
    if (folder / "checkpoint_last.pt").is_file():
        command.append("--resume")
    return command


def read_result(folder: Path, command: Sequence[str], data: Optional["DataCheck"] = None) -> Optional[dict]:
    """The run's ``result.json`` if it was trained with the settings of ``command`` (and, given
    ``data``, on that data), else None."""
    result = _folder_result(folder)
    if result is None or _settings_difference(result, command) is not None:
        return None
    return result if data is None or data.difference(result) is None else None


def _folder_result(folder: Path) -> Optional[dict]:
    try:
        result = json.loads((folder / "result.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None


def _settings_difference(result: dict, command: Sequence[str]) -> Optional[str]:
    """None when ``result`` has the settings of ``command``; else what differs."""
    from ..train_cifar import describe_difference, settings_for

    recorded, now = result.get("settings"), settings_for(command[3:])  # after python -m fairseq_sret_cli.train_cifar
    if recorded == now:
        return None
    if not isinstance(recorded, dict):
        return "it records no settings"
    return f"other settings ({describe_difference(recorded, now)})"


class DataCheck:
    """Whether a result was computed on ``data``: its recorded fingerprints against those of
    ``data`` (:func:`fairseq_sret_cli.fingerprints.data_difference`), computed once per split
    setting. Every reuse of an image run goes through it: a run folder's result, a run the
    results file records, the report, the benchmarks' figures."""

    def __init__(self, data: str):
        self.data = data
        self._fingerprints: Dict[tuple, dict] = {}

    def fingerprints(self, settings: dict) -> dict:
        from ..train_cifar import data_fingerprints

        split = (settings.get("val_split"), settings.get("split_seed"))
        if split not in self._fingerprints:
            self._fingerprints[split] = data_fingerprints(self.data, settings)
        return self._fingerprints[split]

    def difference(self, result: dict) -> Optional[str]:
        """None when ``result`` (a ``result.json``) was computed on this data; else why not."""
        from ..fingerprints import data_difference

        settings = result.get("settings")
        if not isinstance(settings, dict) or "val_split" not in settings:
            return "it records no settings"
        recorded = (result.get("data") or {}).get("fingerprints")
        difference = data_difference(recorded, self.fingerprints(settings))
        return None if difference is None else f"{difference}: not the data of {self.data}"


class RecordedRuns:
    """The finished runs a results file records (``known``: run name -> record), each taken as
    done only with the settings the experiment file now gives it and on the same data
    (:class:`DataCheck`); ``earlier``: the records it keeps of runs done again since."""

    def __init__(self, known: Optional[Dict[str, dict]], data, source: str = "the results file",
                 earlier: Optional[List[dict]] = None):
        self.known, self.source = known or {}, source
        self.check = data if isinstance(data, DataCheck) else DataCheck(data)
        self.data = self.check.data
        self.earlier = list(earlier or [])
        self.replaced: Dict[str, dict] = {}  # recorded runs that did not serve, done again here

    @classmethod
    def from_file(cls, results_file: Path, data) -> "RecordedRuns":
        """The runs ``results_file`` (``RESULTS/NAME.json``) records; none where it is absent."""
        results_file = Path(results_file)
        if not results_file.is_file():
            return cls({}, data, source=str(results_file))
        try:
            stored = json.loads(results_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ExperimentError(f"{results_file}: not a results file ({exc})") from None
        earlier = stored.get("earlier_runs") if isinstance(stored, dict) else None
        return cls(done_runs(stored), data, source=str(results_file),
                   earlier=[r for r in earlier or [] if isinstance(r, dict)])

    def record(self, row: ImageRow, seed: int) -> Optional[dict]:
        record = self.known.get(f"{row.id}/seed{seed}")
        return record if isinstance(record, dict) and isinstance(record.get("result"), dict) else None

    def why_not(self, row: ImageRow, seed: int, command: Sequence[str]) -> Optional[str]:
        """Why the recorded run does not serve here (None: it is done; '' : none is recorded)."""
        record = self.record(row, seed)
        if record is None:
            return ""
        return _settings_difference(record["result"], command) or self.check.difference(record["result"])

    def done(self, row: ImageRow, seed: int, command: Sequence[str]) -> Optional[dict]:
        """The recorded run's record (``result`` and ``history``), or None."""
        why = self.why_not(row, seed, command)
        if why:
            log(f"{row.id}/seed{seed}: {self.source} records it, but {why}; it is trained again")
        return self.record(row, seed) if why is None else None


def run_image_experiment(experiment: ImageExperiment, data: str, output: Path, jobs: int = 1,
                         rows=None, seeds=None, on_run_done=None, recorded: Optional[RecordedRuns] = None,
                         deadline: Optional[float] = None, progress_interval: float = 60.0) -> List[str]:
    """Train every run not yet done (in its folder, or among the ``recorded`` runs), ``jobs`` at
    a time; returns the runs that failed. Arguments the training command would refuse are an
    ExperimentError before any run starts. ``deadline`` (a ``time.time()`` value): no run starts
    after it, and trainings still going then are stopped (they resume from their last epoch).
    Every ``progress_interval`` seconds (0: never) a line says how each training goes."""
    check = recorded.check if recorded is not None else DataCheck(data)
    scheduler = ImageScheduler(experiment, data, output, jobs, check, on_run_done, deadline, progress_interval)
    scheduler.pending = _pending_runs(experiment, data, output, rows, seeds, recorded, check)
    scheduler.schedule()
    return scheduler.failed


def _pending_runs(experiment: ImageExperiment, data: str, output: Path, rows, seeds,
                  recorded: Optional[RecordedRuns], check: "DataCheck") -> List[tuple]:
    """(row, seed, folder) of each selected run not done yet, its command checked first."""
    from ..train_cifar import check_command

    pending = []
    for row, seed in experiment.runs(rows, seeds):
        folder = run_folder(output, row, seed)
        command = train_command(experiment, row, seed, data, folder)
        if read_result(folder, command, check) is not None:
            log(f"{row.id}/seed{seed}: done already ({folder / 'result.json'})")
            continue
        if recorded is not None and recorded.done(row, seed, command) is not None:
            log(f"{row.id}/seed{seed}: done already (recorded in {recorded.source})")
            continue
        try:
            check_command(command[3:])
        except UserError as exc:
            raise ExperimentError(f"{experiment.path}: row {row.id}: {exc}") from None
        pending.append((row, seed, folder))
    return pending


@dataclass
class ImageTraining:
    """A ``sret-train-cifar`` process the scheduler started."""

    name: str
    process: subprocess.Popen
    log_file: IO[str]
    folder: Path
    command: List[str]
    epochs: int  #: the run's --epochs


def progress_line(training: ImageTraining) -> str:
    """How ``training`` goes, from its ``log.jsonl``: its last epoch, validation top-1, CPU
    seconds an epoch (the median of its last 5) and the CPU time its remaining epochs take at
    that pace."""
    history = _history(training.folder)
    if not history:
        return f"{training.name}: no epoch of {training.epochs} finished yet"
    last = history[-1]
    text = f"{training.name}: epoch {last['epoch'] + 1}/{training.epochs}"
    if "val_acc1" in last:
        text += f", validation top-1 {last['val_acc1']:.2f}%"
    per_epoch = [seconds for _, seconds in seconds_by_epoch(history)][-5:]
    if per_epoch:
        pace = statistics.median(per_epoch)
        left = max(training.epochs - last["epoch"] - 1, 0) * pace / 3600
        text += f", {pace:.0f} CPU s an epoch, about {left:.1f} CPU-hours left"
    return text


class ImageScheduler(ProcessScheduler[tuple, ImageTraining]):
    """Trains the pending image runs ``jobs`` at a time (:func:`run_image_experiment`)."""

    def __init__(self, experiment: ImageExperiment, data: str, output: Path, jobs: int, check: "DataCheck",
                 on_run_done=None, deadline: Optional[float] = None, progress_interval: float = 60.0):
        super().__init__(jobs, deadline, progress_interval)
        self.experiment, self.data, self.output, self.check = experiment, data, output, check
        self.on_run_done = on_run_done
        self.failed: List[str] = []

    def start_next(self) -> bool:
        row, seed, folder = self.pending.pop(0)
        folder.mkdir(parents=True, exist_ok=True)
        command = train_command(self.experiment, row, seed, self.data, folder)
        log_file = open(folder / "train.log", "a", encoding="utf-8")
        log_file.write(f"$ {' '.join(shlex.quote(c) for c in command)}\n")
        log_file.flush()
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        from ..train_cifar import settings_for

        epochs = settings_for(command[3:])["epochs"]
        self.running.append(ImageTraining(f"{row.id}/seed{seed}", process, log_file, folder, command, epochs))
        log(f"{row.id}/seed{seed}: training ({'resumed' if '--resume' in command else 'started'}),"
             f" log {folder / 'train.log'}")
        return True

    def progress_lines(self) -> List[str]:
        return [progress_line(training) for training in self.running]

    def reap_ended(self) -> None:
        for training in list(self.running):
            if training.process.poll() is None:
                continue
            training.log_file.close()
            self.running.remove(training)
            if training.process.returncode == 0 and read_result(training.folder, training.command,
                                                                self.check) is not None:
                log(f"{training.name}: done")
                if self.on_run_done:
                    self.on_run_done()
            else:
                self.failed.append(training.name)
                log(f"{training.name}: failed (exit {training.process.returncode}); see"
                     f" {training.folder / 'train.log'}")

    def stop_running(self) -> None:
        """Interrupted or at the deadline: the runs resume from their last epoch."""
        for training in self.running:
            training.process.terminate()
            training.process.wait()
            training.log_file.close()
        self.running.clear()

    def at_deadline(self) -> None:
        unfinished = [f"{row.id}/seed{seed}" for row, seed, _ in self.pending] + [t.name for t in self.running]
        log(f"time limit reached: {len(unfinished)} runs not finished ({', '.join(unfinished)});"
             " the same command resumes them")
        self.stop_running()


# ----------------------------------------------------------------------------- results
def collect(experiment: ImageExperiment, output: Path, data: str,
            recorded: Optional[RecordedRuns] = None) -> List[ImageRunRecord]:
    """Every run's record: its result and per-epoch history when it finished with the file's
    settings on ``data`` (in its folder, else among the ``recorded`` runs), else ``missing``. A
    recorded run that does not serve here is never dropped: it is counted as missing, with
    ``not_matching`` saying why and ``recorded`` the record the results file keeps (once its run
    is done again here, it is among :func:`earlier_records`)."""
    check = recorded.check if recorded is not None else DataCheck(data)
    return [_run_record(experiment, output, data, row, seed, recorded, check) for row, seed in experiment.runs()]


def _run_record(experiment: ImageExperiment, output: Path, data: str, row: ImageRow, seed: int,
                recorded: Optional[RecordedRuns], check: "DataCheck") -> ImageRunRecord:
    folder = run_folder(output, row, seed)
    command = train_command(experiment, row, seed, data, folder)
    result = read_result(folder, command, check)
    why = recorded.why_not(row, seed, command) if recorded is not None else ""
    if result is not None:
        if why:  # done again here: the recorded run is kept among the earlier ones
            recorded.replaced[f"{row.id}/seed{seed}"] = dict(recorded.record(row, seed), not_matching=why)
        return ImageRunRecord(row.id, seed, "done", result, _history(folder))
    if recorded is not None and why is None:
        record = recorded.record(row, seed)
        return ImageRunRecord(row.id, seed, "done" if record["result"] else "missing", record["result"],
                              list(record.get("history") or []))
    if recorded is not None and why:  # counted as missing; the results file keeps it as recorded
        return ImageRunRecord(row.id, seed, "missing", None, [], not_matching=why, recorded=recorded.record(row, seed))
    return ImageRunRecord(row.id, seed, "missing")


def _history(folder: Path) -> List[dict]:
    """The run's per-epoch log (``log.jsonl``); empty where it does not read."""
    try:
        log = (folder / "log.jsonl").read_text(encoding="utf-8")
        return [json.loads(line) for line in log.splitlines()]
    except (OSError, ValueError):
        return []


def earlier_records(recorded: Optional[RecordedRuns]) -> List[dict]:
    """The records a results file keeps beside its runs: those it kept already, and each recorded
    run that did not serve here and was done again (:func:`collect` replaced it)."""
    if recorded is None:
        return []
    return recorded.earlier + [r for r in recorded.replaced.values() if r not in recorded.earlier]
