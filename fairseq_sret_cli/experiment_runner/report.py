"""Results of an experiment: ``NAME.json`` (every run and number), ``NAME.md`` (the table,
mean +- std over seeds and each seed) and PNG plots (see :func:`plot`)."""

import datetime
import json
import os
import math
import platform
import statistics
import textwrap
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_sret.atomic_files import replacing

from .. import pyplot
from ..hardware import device_name
from .experiment_file import Experiment, describe
from .run_evaluation import evaluation_key
from .run_folder import write_text_atomically
from fairseq_sret import json_text


def evaluation_keys(experiment: Experiment) -> List[str]:
    """Every evaluated (checkpoint kind, variant): ``best``, ``best@depth1``, ``last5``, ..."""
    ev = experiment.evaluation
    return [evaluation_key(kind, variant) for kind in ev.checkpoints for variant in ev.variants]


def primary_score(scores: Sequence[dict]) -> Optional[dict]:
    """The data set's headline BLEU: the first score its metadata lists (sacreBLEU for
    Multi30k and WMT'14, tokenized BLEU for IWSLT'14)."""
    bleus = [s for s in scores if not s["name"].startswith("chrF")]
    return bleus[0] if bleus else None


def chrf_score(scores: Sequence[dict]) -> Optional[dict]:
    return next((s for s in scores if s["name"].startswith("chrF")), None)


def run_values(record: dict, experiment: Experiment) -> Dict[str, Optional[float]]:
    """The table's numbers of one run."""
    train, model = record.get("train", {}), record.get("model", {})
    values = {
        "params": model.get("params"),
        "tokens_per_second": train.get("train_tokens_per_second"),
        "seconds_to_best": train.get("seconds_to_best"),
        "best_valid_loss": train.get("best_valid_loss"),
        "best_update": train.get("best_update"),
        "updates": train.get("updates"),
        "epochs": train.get("epochs"),
        "train_seconds": train.get("seconds"),
        "train_cpu_seconds": train["cpu_seconds"] if "cpu_seconds" in train else record.get("train_cpu_seconds"),
    }
    for kind, subsets in (record.get("eval") or {}).items():
        for subset, result in subsets.items():
            bleu, chrf = primary_score(result["scores"]), chrf_score(result["scores"])
            values[f"bleu/{kind}/{subset}"] = bleu["score"] if bleu else None
            values[f"chrf/{kind}/{subset}"] = chrf["score"] if chrf else None
            speed = result.get("speed") or {}
            values[f"speed/{kind}/{subset}"] = speed.get("sentences_per_second")
    return values


def _mean_std(values: List[float]):
    values = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    if not values:
        return None, None, 0
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None), len(values)


def aggregate(experiment: Experiment, records: List[dict]) -> List[dict]:
    """Per row: mean, std and the per-seed values of every number of :func:`run_values`."""
    rows = []
    for row in experiment.rows:
        runs = [r for r in records if r.get("row") == row.id and r.get("status") == "done"]
        per_seed = {r["seed"]: run_values(r, experiment) for r in runs}
        keys = sorted({k for v in per_seed.values() for k in v})
        stats = {}
        for key in keys:
            mean, std, n = _mean_std([v.get(key) for v in per_seed.values()])
            stats[key] = {"mean": mean, "std": std, "n": n}
        applications = next((r["model"]["applications"] for r in runs if r.get("model")), None)
        rows.append({"id": row.id, "title": row.label, "arch": row.arch, "args": row.args, "notes": row.notes,
                     "max_update": row.max_update,
                     "seeds_done": sorted(per_seed), "seeds_planned": row.seeds, "applications": applications,
                     "stats": stats, "per_seed": per_seed})
    return rows


def _signatures(records: List[dict]) -> Dict[str, str]:
    found = {}
    for record in records:
        for subsets in (record.get("eval") or {}).values():
            for result in subsets.values():
                for score in result["scores"]:
                    found.setdefault(score["name"], score["signature"])
    return found


def _subset_names(records: List[dict]) -> Dict[str, str]:
    names = {}
    for record in records:
        for subsets in (record.get("eval") or {}).values():
            for subset, result in subsets.items():
                names[subset] = result.get("subset_name", subset)
    return names


def _fmt(stat: Optional[dict], digits: int = 2, scale: float = 1.0) -> str:
    if not stat or stat.get("mean") is None:
        return "–"
    text = f"{stat['mean'] / scale:.{digits}f}"
    if stat.get("std") is not None:
        text += f" ± {stat['std'] / scale:.{digits}f}"
    return text


def environment() -> dict:
    info = {"python": platform.python_version(), "machine": platform.machine(),
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M")}
    try:
        import torch

        info["torch"] = torch.__version__
        info["device"] = device_name()
    except Exception:  # informative only
        pass
    try:
        import fairseq

        info["fairseq"] = fairseq.__version__
    except Exception:
        pass
    return info


def check_results_files(results_dir: Path, name: str, force: bool = False) -> None:
    """Refuse (:class:`fairseq_sret_cli.outputs.OutputInTheWay`) to write ``NAME.json``,
    ``NAME.md`` and ``NAME_*.png`` over files that sret-experiments did not write. Results
    files are committed and carried between machines, so they are recognised by their
    content: the JSON names the experiment, the markdown and the figures name this command."""
    from ..outputs import Outputs

    def written_here(path: Path) -> bool:
        try:
            if path.suffix == ".json":
                payload = json.loads(path.read_text(encoding="utf-8"))
                return isinstance(payload, dict) and (payload.get("experiment") or {}).get("name") == name
            if path.suffix == ".md":
                return "Produced by `sret-experiments" in path.read_text(encoding="utf-8", errors="replace")
            # a figure: its Description names the command, or (older figures) its results file is ours
            return b"sret-experiments" in path.read_bytes()[:1 << 16] or written_here(results_dir / f"{name}.json")
        except (OSError, ValueError, AttributeError):
            return False

    paths = [results_dir / f"{name}.json", results_dir / f"{name}.md"]
    paths += [results_dir / f"{name}_{suffix}.png" for suffix in FIGURES]
    Outputs("sret-experiments", force=force).check(
        [p for p in paths if os.path.lexists(p)], own=written_here, folders=[results_dir],
        fix="give another --results folder, or pass --force to replace them (nothing else is touched)")


#: the figures :func:`plot` draws, ``NAME_<suffix>.png``
FIGURES = ("valid_loss", "bleu_params", "bleu_cpu", "bleu_speed", "depth")


def write_results(experiment: Experiment, records: List[dict], results_dir, command: str,
                  device_note: str = "", earlier: Sequence[dict] = ()) -> Dict[str, Path]:
    """Write ``NAME.json``, ``NAME.md`` and the plots; returns their paths.

    ``earlier``: finished runs of an earlier configuration, kept in the JSON (not in the
    table) so that rerunning with other settings never loses a measured run.
    """
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    rows = aggregate(experiment, records)
    env = environment()
    if device_note:
        env["note"] = device_note
    out = {"json": results_dir / f"{experiment.name}.json", "md": results_dir / f"{experiment.name}.md"}
    payload = {"experiment": describe(experiment), "command": command, "environment": env,
               "rows": rows, "runs": records, "earlier_runs": list(earlier)}
    write_text_atomically(out["json"], json_text.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    plots = plot(experiment, rows, records, results_dir, env, command)
    out.update(plots)
    write_text_atomically(out["md"], markdown(experiment, rows, records, command, env, plots) + _kept(earlier))
    return out


def _kept(earlier: Sequence[dict]) -> str:
    """The report's lines on the recorded runs it keeps but does not count (``not_matching``: why)."""
    kept = [r for r in earlier if r.get("not_matching")]
    if not kept:
        return ""
    return "\n".join(["", "Recorded runs kept in the JSON (`earlier_runs`) but not counted above:", ""]
                     + [f"- {r.get('row')}/seed{r.get('seed')}: {r['not_matching']}" for r in kept]) + "\n"


def done_runs(stored) -> Dict[str, dict]:
    """Run name (``ROW/seedN``) -> record, for the finished runs of a results file's JSON."""
    runs = stored.get("runs") if isinstance(stored, dict) else None
    return {f"{r['row']}/seed{r['seed']}": r for r in runs or [] if isinstance(r, dict) and r.get("status") == "done"}


def markdown(experiment: Experiment, rows: List[dict], records: List[dict], command: str, env: dict,
             plots: Dict[str, Path]) -> str:
    ev = experiment.evaluation
    subsets = _subset_names(records)
    kinds = evaluation_keys(experiment)
    lines = [f"# {experiment.title}", "",
             f"Produced by `{command}` (experiment file `{experiment.path}`).", "",
             "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()) + ".", ""]
    sched = experiment.schedule
    stop = []
    if sched.patience:
        stop.append(f"until valid loss has not improved for {sched.patience} epochs")
    if sched.max_epoch:
        stop.append(f"at most {sched.max_epoch} epochs")
    if sched.max_update:
        stop.append(f"{'at most ' if sched.patience or sched.max_epoch else ''}{sched.max_update} updates")
    lines += [f"Every row: `{' '.join(sched.args)}`, trained {', '.join(stop)}; beam {ev.beam}, "
              f"lenpen {ev.lenpen}"
              + "".join(f"; `@{name}`: decoded with `{' '.join(flags)}`" for name, flags in ev.variants.items() if name)
              + ". Numbers are mean ± std over the seeds done (n in the seeds column); sent/s is"
              " fairseq-generate's own count (batches of the eval's max tokens)."
              " Train CPU s: user + system CPU time of the training processes (for a resumed run see below);"
              " other seconds: wall clock of the training process (fairseq's `wall`), with the runs trained"
              " side by side as recorded in the JSON.", ""]
    if experiment.notes:
        lines += [experiment.notes.strip(), ""]
    converged = bool(sched.patience)
    header = ["row", "unique params (M)", "layer applications", "seeds", *(["epochs"] if converged else []),
              "updates", "train CPU s", "train tok/s", "seconds to best", "best valid loss"]
    for kind in kinds:
        for subset in ev.subsets:
            name = subsets.get(subset, subset)
            header.append(f"BLEU {name} ({kind})")
            header.append(f"chrF {name} ({kind})")
        header.append(f"sent/s {subsets.get(ev.subsets[0], ev.subsets[0])} ({kind})")
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        s = row["stats"]
        cells = [f"{row['title']} (`{row['id']}`)",
                 _fmt(s.get("params"), 2, 1e6), row["applications"] or "–",
                 f"{len(row['seeds_done'])}/{len(row['seeds_planned'])}",
                 *([_fmt(s.get("epochs"), 0)] if converged else []), _fmt(s.get("updates"), 0), _fmt(s.get("train_cpu_seconds"), 0),
                 _fmt(s.get("tokens_per_second"), 0), _fmt(s.get("seconds_to_best"), 0),
                 _fmt(s.get("best_valid_loss"), 3)]
        for kind in kinds:
            for subset in ev.subsets:
                cells.append(_fmt(s.get(f"bleu/{kind}/{subset}")))
                cells.append(_fmt(s.get(f"chrf/{kind}/{subset}")))
            cells.append(_fmt(s.get(f"speed/{kind}/{ev.subsets[0]}"), 1))
        lines.append("| " + " | ".join(cells) + " |")
    lines += close_rows(rows, [(f"bleu/{k}/{x}", f"BLEU {subsets.get(x, x)} ({k})") for k in kinds for x in ev.subsets])
    lines += mixed_devices(records)
    trained_on = {(r["row"], r["seed"]): ", ".join(r.get("trained_on") or ["–"])
                  for r in records if r.get("status") == "done"}
    lines += ["", "Each seed:", "", "| row | seed | trained on | best valid loss | best at update | seconds to best | "
              + " | ".join(f"BLEU {subsets.get(x, x)} ({k})" for k in kinds for x in ev.subsets) + " |",
              "|" + "---|" * (6 + len(kinds) * len(ev.subsets))]
    for row in rows:
        for seed, v in sorted(row["per_seed"].items()):
            cells = [row["id"], str(seed), trained_on.get((row["id"], seed), "–"),
                     _fmt({"mean": v.get("best_valid_loss")}, 3),
                     str(v.get("best_update") or "–"), _fmt({"mean": v.get("seconds_to_best")}, 0)]
            cells += [_fmt({"mean": v.get(f"bleu/{k}/{x}")}) for k in kinds for x in ev.subsets]
            lines.append("| " + " | ".join(cells) + " |")
    lines += restarted_runs(records)
    lines += cut_runs(records)
    lines += learning_curves(experiment, records, subsets)
    lines += ["", "Rows (architecture and flags added to the schedule's; the row's own update count):", ""]
    for row in rows:
        flags = " ".join(row["args"])
        lines.append(f"- `{row['id']}`: `--arch {row['arch']}{' ' + flags if flags else ''}`"
                     + (f", {row['max_update']} updates" if row.get("max_update") else "")
                     + (f" ({row['notes']})" if row["notes"] else ""))
    signatures = _signatures(records)
    if signatures:
        lines += ["", "Score signatures:", ""] + [f"- {name}: `{sig}`" for name, sig in signatures.items()]
    for key, path in plots.items():
        lines += ["", f"![{key}]({path.name})"]
    return "\n".join(lines) + "\n"


def learning_curves(experiment: Experiment, records: List[dict], subsets: Dict[str, str]) -> List[str]:
    """Markdown lines: BLEU and chrF of every ``eval.curve`` checkpoint of every finished run,
    with the training CPU seconds it cost (the runner's trace; "–" where the trace did not
    reach it)."""
    ev = experiment.evaluation
    done = [r for r in records if r.get("status") == "done" and r.get("curve")]
    if not ev.curve_every or not done:
        return []
    names = [subsets.get(x, x) for x in ev.curve_subsets]
    lines = ["", f"Learning curves: the epoch checkpoints every {ev.curve_every} epochs (and the last), decoded like the"
             " table; training CPU seconds when the checkpoint's update was reached:", "",
             "| run | epoch | update | train CPU s | valid loss | "
             + " | ".join(f"BLEU {n} | chrF {n}" for n in names) + " |",
             "|" + "---|" * (5 + 2 * len(names))]
    for record in sorted(done, key=lambda r: (r["row"], r["seed"])):
        for point in record["curve"]:
            cells = [f"{record['row']}/seed{record['seed']}", str(point["epoch"]), str(point["update"]),
                     _fmt({"mean": point.get("cpu_seconds")}, 0), _fmt({"mean": point.get("valid_loss")}, 3)]
            for subset in ev.curve_subsets:
                scores = (point["eval"].get(subset) or {}).get("scores") or []
                bleu, chrf = primary_score(scores), chrf_score(scores)
                cells += [_fmt({"mean": bleu["score"] if bleu else None}), _fmt({"mean": chrf["score"] if chrf else None})]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def close_rows(rows: List[dict], columns: Sequence[Tuple[str, str]], max_seeds: Optional[int] = None) -> List[str]:
    """Markdown lines on the pairs of rows, each with 2 or more seeds, whose means lie within 2
    standard deviations (the larger of the two) of each other in a column ``(stat key, title)``:
    the seeds done cannot tell them apart there. A further seed is due, unless the study stops at
    ``max_seeds`` seeds a row and both rows have that many: then the pair stays open."""
    found = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            close, seeds = [], []
            for key, title in columns:
                sa, sb = a["stats"].get(key) or {}, b["stats"].get(key) or {}
                if min(sa.get("n") or 0, sb.get("n") or 0) < 2 or sa.get("std") is None or sb.get("std") is None:
                    continue
                gap, spread = abs(sa["mean"] - sb["mean"]), 2 * max(sa["std"], sb["std"])
                if gap < spread:
                    close.append(f"{title} {sa['mean']:.2f} against {sb['mean']:.2f} ({gap:.2f} < {spread:.2f})")
                    seeds.append(min(sa["n"], sb["n"]))
            if not close:
                continue
            line = f"- `{a['id']}` and `{b['id']}`: " + "; ".join(close)
            if max_seeds is not None:
                line += (f": open at {max_seeds} seeds each" if min(seeds) >= max_seeds
                         else ": a further seed is due")
            found.append(line)
    if not found:
        return []
    head = ("Rows whose means lie within 2 standard deviations of each other (the larger of the two; rows"
            " with 2 or more seeds): their seeds cannot tell them apart there")
    if max_seeds is None:
        head += ", and a further seed is due:"
    else:
        head += (f". A further seed is due while a row has fewer than {max_seeds}, the study's seeds a row"
                 " at most; a pair with that many each stays open:")
    return ["", head, ""] + found


def row_devices(records: List[dict]) -> Dict[str, List[str]]:
    """Each row's devices (those its finished runs trained on; an unknown one counts as
    another) when the finished runs trained on more than one device; else empty."""
    done = [r for r in records if r.get("status") == "done"]
    if len({d for r in done for d in r.get("trained_on") or []}) < 2:
        return {}
    by_row: Dict[str, set] = {}
    for r in done:
        by_row.setdefault(r["row"], set()).update(r.get("trained_on") or ["device unknown"])
    return {row: sorted(on) for row, on in by_row.items()}


def mixed_devices(records: List[dict]) -> List[str]:
    """Markdown lines when the finished runs trained on more than one device: their seconds
    (and a resumed run's, when it moved) are not one processor's, so say which rows mix them."""
    by_row = row_devices(records)
    if not by_row:
        return []
    devices = sorted({d for r in records if r.get("status") == "done" for d in r.get("trained_on") or []})
    mixed = sorted(row for row, on in by_row.items() if len(on) > 1)
    text = (f"The runs trained on {len(devices)} devices ({'; '.join(devices)}; the per-seed table names each"
            " run's): BLEU, losses and updates compare across them; seconds (CPU and wall), tokens/s and sent/s"
            " only between runs of one device; the figures name each row's devices.")
    if mixed:
        text += f" Rows whose seconds mix devices: {', '.join(f'`{m}`' for m in mixed)}."
    return ["", text]


def cut_runs(records: List[dict]) -> List[str]:
    """Markdown lines on the finished runs trained past the epoch at which --patience stops them."""
    cut = [r for r in records if r.get("status") == "done" and (r.get("train") or {}).get("epochs_trained")]
    if not cut:
        return []
    lines = ["", "Runs trained past the epoch at which their validation history meets --patience (resumed by a"
             " fairseq that did not keep the count): each is counted, evaluated and timed as of that epoch (its"
             " best, and the epoch checkpoints ending there); the later epochs are left out.", "",
             "| run | best epoch | stops at epoch | trained to epoch |", "|---|---|---|---|"]
    for r in sorted(cut, key=lambda r: (r["row"], r["seed"])):
        train = r["train"]
        lines.append(f"| {r['row']}/seed{r['seed']} | {train.get('best_epoch')} | {train['stopped_at_epoch']} | "
                     f"{train['epochs_trained']} |")
    return lines


def restarted_runs(records: List[dict]) -> List[str]:
    """Markdown lines on the finished runs that took more than one training process."""
    restarted = [r for r in records if r.get("status") == "done" and (r.get("train") or {}).get("starts", 1) > 1]
    if not restarted:
        return []
    lines = ["", "Runs trained by more than one process (stopped at a time limit and resumed, or restarted after"
             " their runner was killed). Updates trained again: a lower bound, from the training log. Train CPU s"
             " follows the path of the checkpoints where the runner kept a CPU trace (eval.curve); otherwise it"
             " counts the processes whose CPU time the runner recorded, and a process killed with its runner is"
             " not counted.", "", "| run | training processes | counted in train CPU s | updates trained again |",
             "|---|---|---|---|"]
    for r in sorted(restarted, key=lambda r: (r["row"], r["seed"])):
        train = r["train"]
        counted = "all (CPU trace)" if train.get("cpu_seconds") is not None else r.get("train_processes", "–")
        if train.get("cpu_traced_to"):  # a trace that ends before the last update: not counted, but said
            traced = train["cpu_traced_to"]
            counted = (f"none: the CPU trace ends at update {traced['update']} of {train.get('updates')}"
                       f" ({traced['seconds']:.0f} s)")
        lines.append(f"| {r['row']}/seed{r['seed']} | {train['starts']} | {counted} | "
                     f"{train.get('repeated_updates', 0)} |")
    return lines


def _seeds(n: int) -> str:
    return f"{n} seed{'' if n == 1 else 's'}"


def figure_caption(env: dict, command: str) -> str:
    """The caption under every figure: where it was measured (processor, the run's note on
    threads and neighbours) and the command that drew it."""
    where = "; ".join(filter(None, [env.get("device"), env.get("note"),
                                    f"torch {env['torch']}" if env.get("torch") else ""]))
    return "\n".join(textwrap.wrap(where, 150) + textwrap.wrap(command, 150))


def plot(experiment: Experiment, rows: List[dict], records: List[dict], results_dir: Path,
         env: Optional[dict] = None, command: str = "") -> Dict[str, Path]:
    """The figures: valid loss against updates and training seconds (every run); BLEU
    against unique parameters, against training CPU seconds and against decoding speed
    (mean +- std per row); and, when a row is decoded at several depths, the depth curve
    (BLEU and sentences/s per decoded variant). Each names the machine and the command,
    under the axes and in the PNG's ``Description``."""
    figures = _Figures(experiment, rows, records, results_dir, figure_caption(env or {}, command))
    figures.valid_loss()
    figures.bleu_against_cost()
    figures.bleu_against_speed()
    figures.learning_curve()
    figures.depth_curve()
    return figures.paths


class _Figures:
    """The figures of :func:`plot`, one a method, each row in the same colour and mark in all."""

    def __init__(self, experiment: Experiment, rows: List[dict], records: List[dict], results_dir: Path,
                 caption: str):
        self.plt = pyplot()
        palette, marks = self.plt.cm.tab20.colors, "osD^vP*Xhp<>"
        self.styles = {row["id"]: (palette[i % len(palette)], marks[i % len(marks)]) for i, row in enumerate(rows)}
        self.experiment, self.rows, self.records, self.results_dir = experiment, rows, records, results_dir
        self.caption = caption
        self.subset = experiment.evaluation.subsets[0]
        self.subset_name = _subset_names(records).get(self.subset, self.subset)
        self.kinds = evaluation_keys(experiment)
        self.on_devices = row_devices(records)
        self.paths: Dict[str, Path] = {}

    def named(self, row_id: str, text: str) -> str:
        """A legend label, with the row's device(s) when the runs trained on several."""
        return f"{text}, {' + '.join(self.on_devices[row_id])}" if row_id in self.on_devices else text

    def new_figure(self, title: str, width: float = 9.5, height: float = 5.0, panels: int = 1):
        fig, axes = self.plt.subplots(1, panels, figsize=(width, height), squeeze=False)
        fig.suptitle("\n".join(textwrap.wrap(f"{self.experiment.title}: {title}", 110)), fontsize=10)
        for axis in axes[0]:
            axis.grid(alpha=0.3)
        return fig, list(axes[0])

    def save(self, fig, key: str, suffix: str, legend_axis) -> None:
        if legend_axis.get_legend_handles_labels()[0]:
            legend_axis.legend(fontsize=6.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
        caption = self.caption
        lines = caption.count("\n") + 1 if caption else 0
        fig.text(0.01, 0.01, caption, fontsize=6.5, va="bottom", ha="left", color="0.3")
        fig.tight_layout(rect=(0, 0.012 + 0.022 * lines, 1, 1))
        self.paths[key] = self.results_dir / f"{self.experiment.name}_{suffix}.png"
        with replacing(self.paths[key]) as tmp:  # a reader, or a kill, sees the old figure or the new one
            fig.savefig(tmp, dpi=110, format="png", metadata={"Description": caption} if caption else None)
        self.plt.close(fig)

    def row_point(self, axis, row: dict, x_key: str, y_key: str, x_scale: float = 1.0, label: str = "",
                  hollow: bool = False) -> None:
        x, y = row["stats"].get(x_key), row["stats"].get(y_key)
        if not x or not y or x.get("mean") is None or y.get("mean") is None:
            return
        color, mark = self.styles[row["id"]]
        axis.errorbar(x["mean"] / x_scale, y["mean"], xerr=(x.get("std") or 0) / x_scale, yerr=y.get("std") or 0,
                      fmt=mark, color=color, capsize=3, mfc="none" if hollow else color,
                      label=self.named(row["id"], label or f"{row['id']} ({_seeds(len(row['seeds_done']))})"))

    def decoded(self, row: dict) -> List[str]:
        """The evaluation keys (checkpoint @ variant) this row has a BLEU for."""
        return [k for k in self.kinds if (row["stats"].get(f"bleu/{k}/{self.subset}") or {}).get("mean") is not None]

    def valid_loss(self) -> None:
        fig, (by_update, by_time) = self.new_figure("validation loss", width=13.0, panels=2)
        labelled = set()
        for record in self.records:
            curve = (record.get("train") or {}).get("curve") or []
            if not curve or record.get("row") not in self.styles:
                continue
            color, _ = self.styles[record["row"]]
            label = None if record["row"] in labelled else self.named(record["row"], record["row"])
            labelled.add(record["row"])
            by_update.plot([p["update"] for p in curve], [p["valid_loss"] for p in curve], color=color)
            by_time.plot([p["seconds"] for p in curve], [p["valid_loss"] for p in curve], color=color, label=label)
        by_update.set_xlabel("updates")
        by_time.set_xlabel("training seconds (wall clock)")
        for axis in (by_update, by_time):
            axis.set_ylabel("valid loss")
        self.save(fig, "valid loss", "valid_loss", legend_axis=by_time)

    def bleu_against_cost(self) -> None:
        """BLEU against unique parameters, and against training CPU seconds."""
        first = self.kinds[0]
        for key, suffix, what, x_key, x_scale, x_label in (
                ("BLEU against parameters", "bleu_params", "unique parameters", "params", 1e6, "unique parameters (M)"),
                ("BLEU against training CPU time", "bleu_cpu", "training CPU time", "train_cpu_seconds", 1.0,
                 "training CPU seconds (user + system, all training processes)")):
            fig, (axis,) = self.new_figure(f"BLEU against {what} ({first} checkpoint)")
            for row in self.rows:
                self.row_point(axis, row, x_key, f"bleu/{first}/{self.subset}", x_scale=x_scale)
            axis.set_xlabel(x_label)
            axis.set_ylabel(f"BLEU {self.subset_name}")
            self.save(fig, key, suffix, legend_axis=axis)

    def bleu_against_speed(self) -> None:
        fig, (axis,) = self.new_figure(f"BLEU against decoding speed (beam {self.experiment.evaluation.beam})")
        for row in self.rows:
            for key in self.kinds:  # the first key filled, every other one (another depth or checkpoint) hollow
                primary = key == self.kinds[0]
                self.row_point(axis, row, f"speed/{key}/{self.subset}", f"bleu/{key}/{self.subset}",
                               label=row["id"] if primary else f"{row['id']} {key}", hollow=not primary)
        axis.set_xlabel(f"sentences/s, {self.subset_name}")
        axis.set_ylabel(f"BLEU {self.subset_name}")
        self.save(fig, "BLEU against speed", "bleu_speed", legend_axis=axis)

    def learning_curve(self) -> None:
        """BLEU of the curve's checkpoints against training CPU time (with ``eval.curve``)."""
        curves = [r for r in self.records
                  if r.get("status") == "done" and r.get("curve") and r.get("row") in self.styles]
        if not curves:
            return
        curve_subset = self.experiment.evaluation.curve_subsets[0]
        fig, (axis,) = self.new_figure("BLEU against training CPU time, a checkpoint every"
                                       f" {self.experiment.evaluation.curve_every} epochs of every run")
        labelled = set()
        for record in curves:
            points = [(p["cpu_seconds"], primary_score((p["eval"].get(curve_subset) or {}).get("scores") or []))
                      for p in record["curve"]]
            points = [(x, b["score"]) for x, b in points if x is not None and b]
            if not points:
                continue
            color, mark = self.styles[record["row"]]
            label = None if record["row"] in labelled else self.named(record["row"], record["row"])
            labelled.add(record["row"])
            axis.plot([x for x, _ in points], [y for _, y in points], mark + "-", color=color, label=label,
                      markersize=4)
        axis.set_xlabel("training CPU seconds (user + system) when the checkpoint was saved")
        axis.set_ylabel(f"BLEU {_subset_names(self.records).get(curve_subset, curve_subset)}")
        self.save(fig, "learning curve", "bleu_cpu_curve", legend_axis=axis)

    def depth_curve(self) -> None:
        """BLEU and sentences/s of each decoded variant, for the rows decoded at several."""
        depth_rows = [(row, done) for row in self.rows if len(done := self.decoded(row)) > 1] \
            if len(self.experiment.evaluation.variants) > 1 else []  # best and last5 alone are no depth curve
        if not depth_rows:
            return
        fig, (by_bleu, by_speed) = self.new_figure("the depth curve (each decoded depth of one trained model)",
                                                   width=13.0, panels=2)
        for row, done in depth_rows:
            color, mark = self.styles[row["id"]]
            for axis, metric in ((by_bleu, "bleu"), (by_speed, "speed")):
                means = [row["stats"].get(f"{metric}/{k}/{self.subset}", {}).get("mean") for k in done]
                stds = [row["stats"].get(f"{metric}/{k}/{self.subset}", {}).get("std") or 0 for k in done]
                if None in means:
                    continue
                axis.errorbar([self.kinds.index(k) for k in done], means, yerr=stds, fmt=mark + "-", color=color,
                              capsize=3, label=f"{row['id']} ({_seeds(len(row['seeds_done']))})")
        for axis in (by_bleu, by_speed):
            axis.set_xticks(range(len(self.kinds)), self.kinds, fontsize=8)
            axis.set_xlabel("decoded checkpoint @ variant (no variant: the trained depth)")
        by_bleu.set_ylabel(f"BLEU {self.subset_name}")
        by_speed.set_ylabel(f"sentences/s, {self.subset_name}")
        self.save(fig, "depth curve", "depth", legend_axis=by_speed)
