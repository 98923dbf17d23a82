"""The image kind's results: ``RESULTS/NAME.json`` (every run as recorded), ``NAME.md`` (a row
a line: model size, training CPU time, validation and test top-1 over the seeds) and
``NAME_curves.png`` (validation top-1 against epochs)."""

import json
from pathlib import Path
from statistics import mean, median, stdev
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from fairseq_sret import json_text

from ... import pyplot
from ...outputs import Outputs
from ..records import ImageRunRecord
from .common import close_rows

if TYPE_CHECKING:
    from ..image_runs import ImageExperiment


def _top1(result: dict, ema: bool = False) -> Optional[float]:
    test = result.get("test_ema" if ema else "test") or {}
    if not test:
        return None
    return next(iter(test.values()))["acc1"]  # the full depth comes first


def _val_top1(record: ImageRunRecord) -> Optional[float]:
    """The run's validation top-1 (the last epoch's, from its ``log.jsonl``): what decides
    which rows get a further seed or a longer run; the test split is only reported."""
    scores = [h["val_acc1"] for h in record.history if "val_acc1" in h]
    return scores[-1] if scores else (record.result or {}).get("val")


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


def seconds_by_epoch(history: Sequence[dict]) -> List[Tuple[dict, float]]:
    """Each epoch of a ``log.jsonl`` history that records its ``cpu_seconds`` (the run's CPU
    seconds so far, resumptions included), with the CPU seconds that epoch took."""
    epochs, before = [], 0.0
    for h in history:
        if isinstance(h.get("cpu_seconds"), (int, float)):
            epochs.append((h, h["cpu_seconds"] - before))
            before = h["cpu_seconds"]
    return epochs


def epoch_cpu_seconds(record: ImageRunRecord) -> Dict[str, float]:
    """A finished run's CPU seconds per epoch, by processor: the median of its epochs on each
    (from the cumulative seconds its ``log.jsonl`` records; an epoch logged without a processor
    counts under the run's when it names one only). Without a log: its mean epoch."""
    result = record.result
    cpu = result.get("cpu") or ""
    single = cpu if cpu and " + " not in cpu else None
    by_cpu: Dict[str, List[float]] = {}
    for h, seconds in seconds_by_epoch(record.history):
        name = h.get("cpu", single)
        if name is not None:
            by_cpu.setdefault(name, []).append(seconds)
    if not by_cpu and single is not None and result.get("epochs"):
        return {single: result["cpu_seconds"] / result["epochs"]}
    return {name: median(seconds) for name, seconds in by_cpu.items()}


def row_epoch_cpu_seconds(records: Sequence[ImageRunRecord]) -> Dict[str, List[float]]:
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


def _epoch_cpu_cell(records: Sequence[ImageRunRecord]) -> str:
    """Median (min-max) over a row's runs of their per-epoch CPU seconds, per processor named beside it."""
    return "; ".join(f"{_median_range(seconds)} ({cpu}, {len(seconds)} run{'s' if len(seconds) > 1 else ''})"
                     for cpu, seconds in row_epoch_cpu_seconds(records).items())


def cpu_time_ratios(experiment: "ImageExperiment", records: List[ImageRunRecord]) -> List[str]:
    """The report's lines on each row's training CPU time against the first row's, per processor
    both trained on: the ratio of their median per-epoch CPU seconds, and the range of the ratio
    the runs allow (slowest over fastest, either way)."""
    done = {row.id: [r for r in records if r.row == row.id and r.done] for row in experiment.rows}
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


def _rows_seeds_cannot_tell_apart(experiment: "ImageExperiment", records: List[ImageRunRecord]) -> List[str]:
    """The report's lines on rows whose validation top-1 means lie within 2 standard deviations of
    each other: a further seed is due, or the pair stays open where both rows have the
    experiment's ``max_seeds``. Decided on validation, never test, scores."""
    rows = []
    for row in experiment.rows:
        val = [v for v in (_val_top1(r) for r in records if r.row == row.id and r.done)
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


def write_image_results(experiment: "ImageExperiment", records: List[ImageRunRecord], results: Path, command: str,
                        force: bool = False, earlier: Sequence[dict] = ()) -> Dict[str, Path]:
    """``RESULTS/NAME.json``, ``NAME.md`` and ``NAME_curves.png`` from the runs' records; files
    in the way that this experiment did not write are refused unless ``force``. Recorded runs
    that do not serve here (``not_matching``, and ``earlier``: those done again since) stay in
    the JSON as recorded and are listed, with why, below the table, which counts none of them."""
    stored = [r.to_json() for r in records]
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
    lines += _rows_table(experiment, records)
    lines += _rows_seeds_cannot_tell_apart(experiment, records)
    lines += cpu_time_ratios(experiment, records)
    lines += _not_matching_lines(stored, earlier)
    cpus = sorted({r.result["cpu"] for r in records if r.done})
    lines += ["", f"Processors: {', '.join(cpus) or 'none yet'}; one thread per run, fp32. Training CPU seconds"
              " compare rows of one processor only. Validation top-1 is the last epoch's, on the images held out of"
              " train: further seeds and longer runs are decided on it; the test split is evaluated once per run, at"
              " its end."]
    outputs.write_text(paths["md"], "\n".join(lines) + "\n", own=ours)
    written = {"experiment": experiment.name, "command": command, "runs": stored}
    if earlier:
        written["earlier_runs"] = list(earlier)
    outputs.write_text(paths["json"], json_text.dumps(written, indent=1) + "\n", own=ours)
    if not _plot_curves(experiment, records, outputs, paths["curves"], ours):
        del paths["curves"]
    return paths


def _rows_table(experiment: "ImageExperiment", records: List[ImageRunRecord]) -> List[str]:
    """One line a row: its model's size, training cost and top-1, mean ± std over its seeds."""
    lines = ["| row | model | parameters | MACs | training CPU s | CPU s per epoch, median (range) of runs | epochs |"
             " validation top-1 (%) | test top-1 (%) | EMA test top-1 (%) | seeds (top-1) | depth 1 top-1 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in experiment.rows:
        done_records = [r for r in records if r.row == row.id and r.done]
        done = [r.result for r in done_records]
        missing = [str(r.seed) for r in records if r.row == row.id and not r.done]
        if not done:
            lines.append(f"| {row.title} | `{row.model}` | | | | | | | missing (seeds {', '.join(missing)}) | | | |")
            continue
        first = done[0]
        top1 = [_top1(r) for r in done]
        ema = [v for v in (_top1(r, True) for r in done) if v is not None]
        depth1 = [r["test"]["depth1"]["acc1"] for r in done if "depth1" in r["test"] and len(r["test"]) > 1]
        val = [v for v in map(_val_top1, done_records) if v is not None]
        seeds_text = ", ".join(f"{r.seed}: {_top1(r.result):.2f}" for r in done_records)
        if missing:
            seeds_text += f"; missing: {', '.join(missing)}"
        lines.append(
            f"| {row.title} | `{row.model}` | {first['params']:,} | {first['macs'] / 1e6:.1f}M |"
            f" {_cpu_seconds(done)} | {_epoch_cpu_cell(done_records)} | {first['epochs']} |"
            f" {_mean_std(val) if val else ''} | {_mean_std(top1)} |"
            f" {_mean_std(ema) if ema else ''} | {seeds_text} | {_mean_std(depth1) if depth1 else ''} |")
    return lines


def _plot_curves(experiment: "ImageExperiment", records: List[ImageRunRecord], outputs: Outputs, path: Path,
                 ours) -> bool:
    """Validation top-1 against epochs, every run in its row's colour; False when no run has a history."""
    curves = [r for r in records if r.history]
    if not curves:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {row.id: f"C{i}" for i, row in enumerate(experiment.rows)}
    titles = {row.id: row.title for row in experiment.rows}
    labelled = set()
    for r in curves:
        points = [(h["epoch"] + 1, h["val_acc1"]) for h in r.history if "val_acc1" in h]
        if not points:
            continue
        ax.plot(*zip(*points), color=colours[r.row], lw=1.2, label=None if r.row in labelled else titles[r.row])
        labelled.add(r.row)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation top-1 (%, held out of train)")
    ax.set_title(experiment.title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with outputs.writing(path, own=ours) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return True
