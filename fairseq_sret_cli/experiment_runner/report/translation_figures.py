"""The translation kind's figures: validation loss, BLEU against parameters, CPU time and
decoding speed, the learning curve and the depth curve."""

import textwrap
from pathlib import Path
from typing import Dict, List, Optional

from fairseq_sret.atomic_files import replacing

from ... import pyplot
from ..experiment_file import Experiment
from ..records import TranslationRunRecord
from .scores import evaluation_keys, primary_score, row_devices, subset_names

#: the figures :func:`plot` draws, ``NAME_<suffix>.png``
FIGURES = ("valid_loss", "bleu_params", "bleu_cpu", "bleu_speed", "depth")


def _seeds(n: int) -> str:
    return f"{n} seed{'' if n == 1 else 's'}"


def figure_caption(env: dict, command: str) -> str:
    """The caption under every figure: where it was measured (processor, the run's note on
    threads and neighbours) and the command that drew it."""
    where = "; ".join(filter(None, [env.get("device"), env.get("note"),
                                    f"torch {env['torch']}" if env.get("torch") else ""]))
    return "\n".join(textwrap.wrap(where, 150) + textwrap.wrap(command, 150))


def plot(experiment: Experiment, rows: List[dict], records: List[TranslationRunRecord], results_dir: Path,
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

    def __init__(self, experiment: Experiment, rows: List[dict], records: List[TranslationRunRecord],
                 results_dir: Path, caption: str):
        self.plt = pyplot()
        palette, marks = self.plt.cm.tab20.colors, "osD^vP*Xhp<>"
        self.styles = {row["id"]: (palette[i % len(palette)], marks[i % len(marks)]) for i, row in enumerate(rows)}
        self.experiment, self.rows, self.records, self.results_dir = experiment, rows, records, results_dir
        self.caption = caption
        self.subset = experiment.evaluation.subsets[0]
        self.subset_name = subset_names(records).get(self.subset, self.subset)
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
            curve = (record.train or {}).get("curve") or []
            if not curve or record.row not in self.styles:
                continue
            color, _ = self.styles[record.row]
            label = None if record.row in labelled else self.named(record.row, record.row)
            labelled.add(record.row)
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
        curves = [r for r in self.records if r.done and r.curve and r.row in self.styles]
        if not curves:
            return
        curve_subset = self.experiment.evaluation.curve_subsets[0]
        fig, (axis,) = self.new_figure("BLEU against training CPU time, a checkpoint every"
                                       f" {self.experiment.evaluation.curve_every} epochs of every run")
        labelled = set()
        for record in curves:
            points = [(p["cpu_seconds"], primary_score((p["eval"].get(curve_subset) or {}).get("scores") or []))
                      for p in record.curve]
            points = [(x, b["score"]) for x, b in points if x is not None and b]
            if not points:
                continue
            color, mark = self.styles[record.row]
            label = None if record.row in labelled else self.named(record.row, record.row)
            labelled.add(record.row)
            axis.plot([x for x, _ in points], [y for _, y in points], mark + "-", color=color, label=label,
                      markersize=4)
        axis.set_xlabel("training CPU seconds (user + system) when the checkpoint was saved")
        axis.set_ylabel(f"BLEU {subset_names(self.records).get(curve_subset, curve_subset)}")
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
