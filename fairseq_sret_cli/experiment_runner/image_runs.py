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
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, median, stdev
from typing import Dict, List, Optional, Sequence

from .. import UserError, pyplot
from ..outputs import Outputs
from .experiment_file import ExperimentError, plain_name, select_rows
from .report import close_rows, done_runs
from fairseq_sret import json_text

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


def _log(message: str) -> None:
    print(f"[experiments] {message}", file=sys.stderr, flush=True)


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
            _log(f"{row.id}/seed{seed}: {self.source} records it, but {why}; it is trained again")
        return self.record(row, seed) if why is None else None


def run_image_experiment(experiment: ImageExperiment, data: str, output: Path, jobs: int = 1,
                         rows=None, seeds=None, on_run_done=None, recorded: Optional[RecordedRuns] = None,
                         deadline: Optional[float] = None) -> List[str]:
    """Train every run not yet done (in its folder, or among the ``recorded`` runs), ``jobs`` at
    a time; returns the runs that failed. Arguments the training command would refuse are an
    ExperimentError before any run starts. ``deadline`` (a ``time.time()`` value): no run starts
    after it, and trainings still going then are stopped (they resume from their last epoch)."""
    from ..train_cifar import check_command

    check = recorded.check if recorded is not None else DataCheck(data)
    pending = []
    for row, seed in experiment.runs(rows, seeds):
        folder = run_folder(output, row, seed)
        command = train_command(experiment, row, seed, data, folder)
        if read_result(folder, command, check) is not None:
            _log(f"{row.id}/seed{seed}: done already ({folder / 'result.json'})")
            continue
        if recorded is not None and recorded.done(row, seed, command) is not None:
            _log(f"{row.id}/seed{seed}: done already (recorded in {recorded.source})")
            continue
        try:
            check_command(command[3:])
        except UserError as exc:
            raise ExperimentError(f"{experiment.path}: row {row.id}: {exc}") from None
        pending.append((row, seed, folder))
    running: Dict[str, tuple] = {}
    failed = []
    try:
        while pending or running:
            if deadline is not None and time.time() >= deadline:
                unfinished = [f"{row.id}/seed{seed}" for row, seed, _ in pending] + list(running)
                _log(f"time limit reached: {len(unfinished)} runs not finished ({', '.join(unfinished)});"
                     " the same command resumes them")
                break
            while pending and len(running) < jobs:
                row, seed, folder = pending.pop(0)
                folder.mkdir(parents=True, exist_ok=True)
                command = train_command(experiment, row, seed, data, folder)
                log_file = open(folder / "train.log", "a", encoding="utf-8")
                log_file.write(f"$ {' '.join(shlex.quote(c) for c in command)}\n")
                log_file.flush()
                process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
                running[f"{row.id}/seed{seed}"] = (process, log_file, folder, command)
                _log(f"{row.id}/seed{seed}: training ({'resumed' if '--resume' in command else 'started'}),"
                     f" log {folder / 'train.log'}")
            time.sleep(1.0)
            for name, (process, log_file, folder, command) in list(running.items()):
                if process.poll() is None:
                    continue
                log_file.close()
                del running[name]
                if process.returncode == 0 and read_result(folder, command, check) is not None:
                    _log(f"{name}: done")
                    if on_run_done:
                        on_run_done()
                else:
                    failed.append(name)
                    _log(f"{name}: failed (exit {process.returncode}); see {folder / 'train.log'}")
    finally:
        for process, log_file, _, _ in running.values():  # interrupted: the runs resume from their last epoch
            process.terminate()
            process.wait()
            log_file.close()
    return failed


# ----------------------------------------------------------------------------- results
def collect(experiment: ImageExperiment, output: Path, data: str,
            recorded: Optional[RecordedRuns] = None) -> List[dict]:
    """Every run's record: its result and per-epoch history when it finished with the file's
    settings on ``data`` (in its folder, else among the ``recorded`` runs), else ``status:
    missing``. A recorded run that does not serve here is never dropped: it is counted as missing,
    with ``not_matching`` saying why and ``recorded`` the record the results file keeps (once its
    run is done again here, it is among :func:`earlier_records`)."""
    check = recorded.check if recorded is not None else DataCheck(data)
    records = []
    for row, seed in experiment.runs():
        folder = run_folder(output, row, seed)
        command = train_command(experiment, row, seed, data, folder)
        result = read_result(folder, command, check)
        history = []
        why = recorded.why_not(row, seed, command) if recorded is not None else ""
        if result is not None:
            try:
                log = (folder / "log.jsonl").read_text(encoding="utf-8")
                history = [json.loads(line) for line in log.splitlines()]
            except (OSError, ValueError):
                pass
            if why:  # done again here: the recorded run is kept among the earlier ones
                recorded.replaced[f"{row.id}/seed{seed}"] = dict(recorded.record(row, seed), not_matching=why)
        elif recorded is not None:
            if why is None:
                record = recorded.record(row, seed)
                result, history = record["result"], list(record.get("history") or [])
            elif why:  # counted as missing; the results file keeps it as recorded
                records.append({"row": row.id, "seed": seed, "status": "missing", "result": None, "history": [],
                                "not_matching": why, "recorded": recorded.record(row, seed)})
                continue
        records.append({"row": row.id, "seed": seed, "status": "done" if result else "missing",
                        "result": result, "history": history})
    return records


def earlier_records(recorded: Optional[RecordedRuns]) -> List[dict]:
    """The records a results file keeps beside its runs: those it kept already, and each recorded
    run that did not serve here and was done again (:func:`collect` replaced it)."""
    if recorded is None:
        return []
    return recorded.earlier + [r for r in recorded.replaced.values() if r not in recorded.earlier]


def _top1(result: dict, ema: bool = False) -> Optional[float]:
    test = result.get("test_ema" if ema else "test") or {}
    if not test:
        return None
    return next(iter(test.values()))["acc1"]  # the full depth comes first


def _val_top1(record: dict) -> Optional[float]:
    """The run's validation top-1 (the last epoch's, from its ``log.jsonl``): what decides
    which rows get a further seed or a longer run; the test split is only reported."""
    scores = [h["val_acc1"] for h in record.get("history") or [] if "val_acc1" in h]
    return scores[-1] if scores else (record.get("result") or {}).get("val")


def _mean_std(values: Sequence[float]) -> str:
    if not values:
        return "missing"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{mean(values):.2f} ± {stdev(values):.2f}"


def _cpu_seconds(done: Sequence[dict]) -> str:
    """Training CPU seconds of a row's finished runs, a mean per processor named beside it
    (seconds of different processors are not comparable)."""
    by_cpu: Dict[str, List[float]] = {}
    for result in done:
        by_cpu.setdefault(result["cpu"], []).append(result["cpu_seconds"])
    return "; ".join(f"{mean(seconds):,.0f} ({cpu})" for cpu, seconds in by_cpu.items())


def epoch_cpu_seconds(record: dict) -> Dict[str, float]:
    """A finished run's CPU seconds per epoch, by processor: the median of its epochs on each
    (from the cumulative seconds its ``log.jsonl`` records; an epoch logged without a processor
    counts under the run's when it names one only). Without a log: its mean epoch."""
    result = record["result"]
    cpu = result.get("cpu") or ""
    single = cpu if cpu and " + " not in cpu else None
    by_cpu: Dict[str, List[float]] = {}
    before = 0.0
    for h in record.get("history") or []:
        if "cpu_seconds" not in h:
            continue
        name = h.get("cpu", single)
        if name is not None:
            by_cpu.setdefault(name, []).append(h["cpu_seconds"] - before)
        before = h["cpu_seconds"]
    if not by_cpu and single is not None and result.get("epochs"):
        return {single: result["cpu_seconds"] / result["epochs"]}
    return {name: median(seconds) for name, seconds in by_cpu.items()}


def row_epoch_cpu_seconds(records: Sequence[dict]) -> Dict[str, List[float]]:
    """Processor -> the per-epoch CPU seconds (:func:`epoch_cpu_seconds`) of a row's finished runs on it."""
    by_cpu: Dict[str, List[float]] = {}
    for record in records:
        for name, seconds in epoch_cpu_seconds(record).items():
            by_cpu.setdefault(name, []).append(seconds)
    return by_cpu


def _median_range(values: Sequence[float], digits: int = 1) -> str:
    if len(values) == 1:
        return f"{values[0]:,.{digits}f}"
    return f"{median(values):,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"


def _epoch_cpu_cell(records: Sequence[dict]) -> str:
    """Median (min-max) over a row's runs of their per-epoch CPU seconds, per processor named beside it."""
    return "; ".join(f"{_median_range(seconds)} ({cpu}, {len(seconds)} run{'s' if len(seconds) > 1 else ''})"
                     for cpu, seconds in row_epoch_cpu_seconds(records).items())


def cpu_time_ratios(experiment: ImageExperiment, records: List[dict]) -> List[str]:
    """The report's lines on each row's training CPU time against the first row's, per processor
    both trained on: the ratio of their median per-epoch CPU seconds, and the range of the ratio
    the runs allow (slowest over fastest, either way)."""
    done = {row.id: [r for r in records if r["row"] == row.id and r["status"] == "done"] for row in experiment.rows}
    reference = experiment.rows[0].id
    base = row_epoch_cpu_seconds(done[reference])
    found = []
    for row in experiment.rows[1:]:
        for cpu, seconds in row_epoch_cpu_seconds(done[row.id]).items():
            if cpu not in base:
                continue
            ratio = median(seconds) / median(base[cpu])
            low, high = min(seconds) / max(base[cpu]), max(seconds) / min(base[cpu])
            spread = f" ({low:.2f}-{high:.2f})" if low != high else ""
            found.append(f"| `{row.id}` | {cpu} | {len(seconds)}, {len(base[cpu])} | {ratio:.2f}{spread} |")
    if not found:
        return []
    return ["", f"Training CPU time against `{reference}`, per processor both trained on: the ratio of the median"
                " per-epoch CPU seconds of their runs there (in brackets, the range the runs allow):", "",
            f"| row | processor | runs (row, `{reference}`) | CPU time, ratio (range) |", "|---|---|---|---|"] + found


def _rows_seeds_cannot_tell_apart(experiment: ImageExperiment, records: List[dict]) -> List[str]:
    """The report's lines on rows whose validation top-1 means lie within 2 standard deviations of
    each other: a further seed is due, or the pair stays open where both rows have the
    experiment's ``max_seeds``. Decided on validation, never test, scores."""
    rows = []
    for row in experiment.rows:
        val = [v for v in (_val_top1(r) for r in records if r["row"] == row.id and r["status"] == "done")
               if v is not None]
        rows.append({"id": row.id, "stats": {"val_top1": {"mean": mean(val) if val else None, "n": len(val),
                                                          "std": stdev(val) if len(val) > 1 else None}}})
    return close_rows(rows, [("val_top1", "validation top-1")], experiment.max_seeds)


def _not_matching_lines(records: Sequence[dict], earlier: Sequence[dict]) -> List[str]:
    """The report's lines on the recorded runs it keeps but does not count, each with why."""
    kept = [r for r in records if r.get("not_matching")]
    if not kept and not earlier:
        return []
    lines = ["", "Recorded runs kept in the JSON but not counted above (they do not match this command's data or"
                 " settings):"]
    lines += [f"- {r['row']}/seed{r['seed']}: {r['not_matching']}" for r in kept]
    lines += [f"- {r.get('row')}/seed{r.get('seed')} (done again since): {r.get('not_matching', 'replaced')}"
              for r in earlier]
    return lines


def write_image_results(experiment: ImageExperiment, records: List[dict], results: Path, command: str,
                        force: bool = False, earlier: Sequence[dict] = ()) -> Dict[str, Path]:
    """``RESULTS/NAME.json``, ``NAME.md`` and ``NAME_curves.png`` from the runs' folders; files
    in the way that this experiment did not write are refused unless ``force``. Recorded runs
    that do not serve here (``not_matching``, and ``earlier``: those done again since) stay in
    the JSON as recorded and are listed, with why, below the table, which counts none of them."""
    stored = [dict(r["recorded"], not_matching=r["not_matching"]) if r.get("recorded") else r for r in records]
    results = Path(results)
    outputs = Outputs("sret-experiments", force=force, settings={"experiment": experiment.name})
    paths = {"md": results / f"{experiment.name}.md", "json": results / f"{experiment.name}.json",
             "curves": results / f"{experiment.name}_curves.png"}

    def ours(_path: Path) -> bool:
        """Results of this experiment, recognised by the JSON that names it (a clone has no manifest)."""
        try:
            return json.loads(paths["json"].read_text(encoding="utf-8")).get("experiment") == experiment.name
        except (OSError, ValueError, AttributeError):
            return False

    outputs.check(paths.values(), own=ours)
    lines = [f"# {experiment.title}", "", f"Written by `{command}` from `{experiment.path}`.", ""]
    if experiment.notes:
        lines += [experiment.notes, ""]
    lines += ["| row | model | parameters | MACs | training CPU s | CPU s per epoch, median (range) of runs | epochs |"
              " validation top-1 (%) | test top-1 (%) | EMA test top-1 (%) | seeds (top-1) | depth 1 top-1 |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in experiment.rows:
        done_records = [r for r in records if r["row"] == row.id and r["status"] == "done"]
        done = [r["result"] for r in done_records]
        missing = [str(r["seed"]) for r in records if r["row"] == row.id and r["status"] != "done"]
        if not done:
            lines.append(f"| {row.title} | `{row.model}` | | | | | | | missing (seeds {', '.join(missing)}) | | | |")
            continue
        first = done[0]
        top1 = [_top1(r) for r in done]
        ema = [v for v in (_top1(r, True) for r in done) if v is not None]
        depth1 = [r["test"]["depth1"]["acc1"] for r in done if "depth1" in r["test"] and len(r["test"]) > 1]
        val = [v for v in map(_val_top1, done_records) if v is not None]
        seeds_text = ", ".join(f"{r['seed']}: {_top1(r['result']):.2f}" for r in records
                               if r["row"] == row.id and r["status"] == "done")
        if missing:
            seeds_text += f"; missing: {', '.join(missing)}"
        lines.append(
            f"| {row.title} | `{row.model}` | {first['params']:,} | {first['macs'] / 1e6:.1f}M |"
            f" {_cpu_seconds(done)} | {_epoch_cpu_cell(done_records)} | {first['epochs']} |"
            f" {_mean_std(val) if val else ''} | {_mean_std(top1)} |"
            f" {_mean_std(ema) if ema else ''} | {seeds_text} | {_mean_std(depth1) if depth1 else ''} |")
    lines += _rows_seeds_cannot_tell_apart(experiment, records)
    lines += cpu_time_ratios(experiment, records)
    lines += _not_matching_lines(stored, earlier)
    cpus = sorted({r["result"]["cpu"] for r in records if r["status"] == "done"})
    lines += ["", f"Processors: {', '.join(cpus) or 'none yet'}; one thread per run, fp32. Training CPU seconds"
              " compare rows of one processor only. Validation top-1 is the last epoch's, on the images held out of"
              " train: further seeds and longer runs are decided on it; the test split is evaluated once per run, at"
              " its end."]
    outputs.write_text(paths["md"], "\n".join(lines) + "\n", own=ours)
    written = {"experiment": experiment.name, "command": command, "runs": stored}
    if earlier:
        written["earlier_runs"] = list(earlier)
    outputs.write_text(paths["json"], json_text.dumps(written, indent=1) + "\n", own=ours)
    curves = [r for r in records if r["history"]]
    if curves:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4.5))
        colours = {row.id: f"C{i}" for i, row in enumerate(experiment.rows)}
        titles = {row.id: row.title for row in experiment.rows}
        labelled = set()
        for r in curves:
            points = [(h["epoch"] + 1, h["val_acc1"]) for h in r["history"] if "val_acc1" in h]
            if not points:
                continue
            ax.plot(*zip(*points), color=colours[r["row"]], lw=1.2,
                    label=None if r["row"] in labelled else titles[r["row"]])
            labelled.add(r["row"])
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation top-1 (%, held out of train)")
        ax.set_title(experiment.title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        with outputs.writing(paths["curves"], own=ours) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
        plt.close(fig)
    else:
        del paths["curves"]
    return paths
