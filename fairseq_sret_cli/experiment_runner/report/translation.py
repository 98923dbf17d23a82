"""The translation kind's results: ``NAME.json`` (every run and number), ``NAME.md`` (the table,
mean +- std over seeds and each seed) and PNG plots (:mod:`.translation_figures`)."""

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from fairseq_sret import json_text

from ...hardware import device_name
from ..experiment_file import Experiment, describe
from ..records import TranslationRunRecord
from ..run_folder import write_text_atomically
from .common import close_rows
from .scores import (aggregate, chrf_score, evaluation_keys, format_stat, primary_score, row_devices, signatures,
                     subset_names)
from .translation_figures import FIGURES, plot


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
    from ...outputs import Outputs

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


def write_results(experiment: Experiment, records: List[TranslationRunRecord], results_dir, command: str,
                  device_note: str = "", earlier: Sequence[TranslationRunRecord] = (),
                  env: Optional[dict] = None) -> Dict[str, Path]:
    """Write ``NAME.json``, ``NAME.md`` and the plots; returns their paths.

    ``earlier``: finished runs of an earlier configuration, kept in the JSON (not in the
    table) so that rerunning with other settings never loses a measured run. ``env``: the
    environment the report names (default: this machine, now); ``--report-only`` passes the
    recorded one, so that a report written again from the same runs is the same file.
    """
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    rows = aggregate(experiment, records)
    env = dict(env) if env else environment()
    if device_note:
        env["note"] = device_note
    out = {"json": results_dir / f"{experiment.name}.json", "md": results_dir / f"{experiment.name}.md"}
    payload = {"experiment": describe(experiment), "command": command, "environment": env,
               "rows": rows, "runs": [r.to_json() for r in records], "earlier_runs": [r.to_json() for r in earlier]}
    write_text_atomically(out["json"], json_text.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    plots = plot(experiment, rows, records, results_dir, env, command)
    out.update(plots)
    write_text_atomically(out["md"], markdown(experiment, rows, records, command, env, plots) + _kept(earlier))
    return out


def _kept(earlier: Sequence[TranslationRunRecord]) -> str:
    """The report's lines on the recorded runs it keeps but does not count (``not_matching``: why)."""
    kept = [r for r in earlier if r.not_matching]
    if not kept:
        return ""
    return "\n".join(["", "Recorded runs kept in the JSON (`earlier_runs`) but not counted above:", ""]
                     + [f"- {r.name}: {r.not_matching}" for r in kept]) + "\n"


def markdown(experiment: Experiment, rows: List[dict], records: List[TranslationRunRecord], command: str, env: dict,
             plots: Dict[str, Path]) -> str:
    """The report page: what was run and where, the rows' table, each seed's, and the figures."""
    ev = experiment.evaluation
    subsets = subset_names(records)
    kinds = evaluation_keys(experiment)
    lines = [f"# {experiment.title}", "",
             f"Produced by `{command}` (experiment file `{experiment.path}`).", "",
             "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()) + ".", ""]
    lines += _recipe_lines(experiment)
    lines += _rows_table(experiment, rows, subsets, kinds)
    lines += close_rows(rows, [(f"bleu/{k}/{x}", f"BLEU {subsets.get(x, x)} ({k})") for k in kinds for x in ev.subsets])
    lines += mixed_devices(records)
    lines += _seeds_table(experiment, rows, records, subsets, kinds)
    lines += restarted_runs(records)
    lines += cut_runs(records)
    lines += learning_curves(experiment, records, subsets)
    lines += ["", "Rows (architecture and flags added to the schedule's; the row's own update count):", ""]
    for row in rows:
        flags = " ".join(row["args"])
        lines.append(f"- `{row['id']}`: `--arch {row['arch']}{' ' + flags if flags else ''}`"
                     + (f", {row['max_update']} updates" if row.get("max_update") else "")
                     + (f" ({row['notes']})" if row["notes"] else ""))
    found = signatures(records)
    if found:
        lines += ["", "Score signatures:", ""] + [f"- {name}: `{sig}`" for name, sig in found.items()]
    for key, path in plots.items():
        lines += ["", f"![{key}]({path.name})"]
    return "\n".join(lines) + "\n"


def _recipe_lines(experiment: Experiment) -> List[str]:
    """The schedule every row shares, how it stops, how it is decoded, and the file's notes."""
    ev, sched = experiment.evaluation, experiment.schedule
    stop = []
    if sched.patience:
        stop.append(f"until valid loss has not improved for {sched.patience} epochs")
    if sched.max_epoch:
        stop.append(f"at most {sched.max_epoch} epochs")
    if sched.max_update:
        stop.append(f"{'at most ' if sched.patience or sched.max_epoch else ''}{sched.max_update} updates")
    lines = [f"Every row: `{' '.join(sched.args)}`, trained {', '.join(stop)}; beam {ev.beam}, "
             f"lenpen {ev.lenpen}"
             + "".join(f"; `@{name}`: decoded with `{' '.join(flags)}`" for name, flags in ev.variants.items() if name)
             + ". Numbers are mean ± std over the seeds done (n in the seeds column); sent/s is"
             " fairseq-generate's own count (batches of the eval's max tokens)."
             " Train CPU s: user + system CPU time of the training processes (for a resumed run see below);"
             " other seconds: wall clock of the training process (fairseq's `wall`), with the runs trained"
             " side by side as recorded in the JSON.", ""]
    if experiment.notes:
        lines += [experiment.notes.strip(), ""]
    return lines


def _rows_table(experiment: Experiment, rows: List[dict], subsets: Dict[str, str], kinds: List[str]) -> List[str]:
    """One line a row: mean ± std over its seeds."""
    ev = experiment.evaluation
    converged = bool(experiment.schedule.patience)
    header = ["row", "unique params (M)", "layer applications", "seeds", *(["epochs"] if converged else []),
              "updates", "train CPU s", "train tok/s", "seconds to best", "best valid loss"]
    for kind in kinds:
        for subset in ev.subsets:
            name = subsets.get(subset, subset)
            header.append(f"BLEU {name} ({kind})")
            header.append(f"chrF {name} ({kind})")
        header.append(f"sent/s {subsets.get(ev.subsets[0], ev.subsets[0])} ({kind})")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        s = row["stats"]
        cells = [f"{row['title']} (`{row['id']}`)",
                 format_stat(s.get("params"), 2, 1e6), row["applications"] or "–",
                 f"{len(row['seeds_done'])}/{len(row['seeds_planned'])}",
                 *([format_stat(s.get("epochs"), 0)] if converged else []), format_stat(s.get("updates"), 0),
                 format_stat(s.get("train_cpu_seconds"), 0),
                 format_stat(s.get("tokens_per_second"), 0), format_stat(s.get("seconds_to_best"), 0),
                 format_stat(s.get("best_valid_loss"), 3)]
        for kind in kinds:
            for subset in ev.subsets:
                cells.append(format_stat(s.get(f"bleu/{kind}/{subset}")))
                cells.append(format_stat(s.get(f"chrf/{kind}/{subset}")))
            cells.append(format_stat(s.get(f"speed/{kind}/{ev.subsets[0]}"), 1))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _seeds_table(experiment: Experiment, rows: List[dict], records: List[TranslationRunRecord], subsets: Dict[str, str],
                 kinds: List[str]) -> List[str]:
    """One line a finished run."""
    ev = experiment.evaluation
    trained_on = {(r.row, r.seed): ", ".join(r.trained_on or ["–"]) for r in records if r.done}
    lines = ["", "Each seed:", "", "| row | seed | trained on | best valid loss | best at update | seconds to best | "
             + " | ".join(f"BLEU {subsets.get(x, x)} ({k})" for k in kinds for x in ev.subsets) + " |",
             "|" + "---|" * (6 + len(kinds) * len(ev.subsets))]
    for row in rows:
        for seed, v in sorted(row["per_seed"].items()):
            cells = [row["id"], str(seed), trained_on.get((row["id"], seed), "–"),
                     format_stat({"mean": v.get("best_valid_loss")}, 3),
                     str(v.get("best_update") or "–"), format_stat({"mean": v.get("seconds_to_best")}, 0)]
            cells += [format_stat({"mean": v.get(f"bleu/{k}/{x}")}) for k in kinds for x in ev.subsets]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def learning_curves(experiment: Experiment, records: List[TranslationRunRecord],
                    subsets: Dict[str, str]) -> List[str]:
    """Markdown lines: BLEU and chrF of every ``eval.curve`` checkpoint of every finished run,
    with the training CPU seconds it cost (the runner's trace; "–" where the trace did not
    reach it)."""
    ev = experiment.evaluation
    done = [r for r in records if r.done and r.curve]
    if not ev.curve_every or not done:
        return []
    names = [subsets.get(x, x) for x in ev.curve_subsets]
    lines = ["", f"Learning curves: the epoch checkpoints every {ev.curve_every} epochs (and the last), decoded like the"
             " table; training CPU seconds when the checkpoint's update was reached:", "",
             "| run | epoch | update | train CPU s | valid loss | "
             + " | ".join(f"BLEU {n} | chrF {n}" for n in names) + " |",
             "|" + "---|" * (5 + 2 * len(names))]
    for record in sorted(done, key=lambda r: (r.row, r.seed)):
        for point in record.curve:
            cells = [record.name, str(point["epoch"]), str(point["update"]),
                     format_stat({"mean": point.get("cpu_seconds")}, 0), format_stat({"mean": point.get("valid_loss")}, 3)]
            for subset in ev.curve_subsets:
                scores = (point["eval"].get(subset) or {}).get("scores") or []
                bleu, chrf = primary_score(scores), chrf_score(scores)
                cells += [format_stat({"mean": bleu["score"] if bleu else None}), format_stat({"mean": chrf["score"] if chrf else None})]
            lines.append("| " + " | ".join(cells) + " |")
    return lines



def mixed_devices(records: List[TranslationRunRecord]) -> List[str]:
    """Markdown lines when the finished runs trained on more than one device: their seconds
    (and a resumed run's, when it moved) are not one processor's, so say which rows mix them."""
    by_row = row_devices(records)
    if not by_row:
        return []
    devices = sorted({d for r in records if r.done for d in r.trained_on or []})
    mixed = sorted(row for row, on in by_row.items() if len(on) > 1)
    text = (f"The runs trained on {len(devices)} devices ({'; '.join(devices)}; the per-seed table names each"
            " run's): BLEU, losses and updates compare across them; seconds (CPU and wall), tokens/s and sent/s"
            " only between runs of one device; the figures name each row's devices.")
    if mixed:
        text += f" Rows whose seconds mix devices: {', '.join(f'`{m}`' for m in mixed)}."
    return ["", text]


def cut_runs(records: List[TranslationRunRecord]) -> List[str]:
    """Markdown lines on the finished runs trained past the epoch at which --patience stops them."""
    cut = [r for r in records if r.done and (r.train or {}).get("epochs_trained")]
    if not cut:
        return []
    lines = ["", "Runs trained past the epoch at which their validation history meets --patience (resumed by a"
             " fairseq that did not keep the count): each is counted, evaluated and timed as of that epoch (its"
             " best, and the epoch checkpoints ending there); the later epochs are left out.", "",
             "| run | best epoch | stops at epoch | trained to epoch |", "|---|---|---|---|"]
    for r in sorted(cut, key=lambda r: (r.row, r.seed)):
        train = r.train
        lines.append(f"| {r.name} | {train.get('best_epoch')} | {train['stopped_at_epoch']} | "
                     f"{train['epochs_trained']} |")
    return lines


def restarted_runs(records: List[TranslationRunRecord]) -> List[str]:
    """Markdown lines on the finished runs that took more than one training process."""
    restarted = [r for r in records if r.done and (r.train or {}).get("starts", 1) > 1]
    if not restarted:
        return []
    lines = ["", "Runs trained by more than one process (stopped at a time limit and resumed, or restarted after"
             " their runner was killed). Updates trained again: a lower bound, from the training log. Train CPU s"
             " follows the path of the checkpoints where the runner kept a CPU trace (eval.curve); otherwise it"
             " counts the processes whose CPU time the runner recorded, and a process killed with its runner is"
             " not counted.", "", "| run | training processes | counted in train CPU s | updates trained again |",
             "|---|---|---|---|"]
    for r in sorted(restarted, key=lambda r: (r.row, r.seed)):
        train = r.train
        processes = "–" if r.train_processes is None else r.train_processes
        counted = "all (CPU trace)" if train.get("cpu_seconds") is not None else processes
        if train.get("cpu_traced_to"):  # a trace that ends before the last update: not counted, but said
            traced = train["cpu_traced_to"]
            counted = (f"none: the CPU trace ends at update {traced['update']} of {train.get('updates')}"
                       f" ({traced['seconds']:.0f} s)")
        lines.append(f"| {r.name} | {train['starts']} | {counted} | "
                     f"{train.get('repeated_updates', 0)} |")
    return lines
