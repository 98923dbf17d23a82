"""The evolution of the Learnable Residual Connection coefficients over a training run.

The paper (Fig. "evolution of coefficients") plots the LRC scalars of a block against
training progress. Our models name them ``...skip_scale`` / ``...branch_scale`` (shape
[1]); this module reads them from every checkpoint of a run, with the update number and
epoch from the checkpoint's training state, and plots them per layer (matplotlib, the
optional ``plot`` extra) or formats them as a table.
"""

import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_sret.checkpoints import checkpoint_epoch, checkpoint_num_updates, load_checkpoint

from .. import pyplot

SUFFIXES = ("skip_scale", "branch_scale")
_RUN_CHECKPOINT = re.compile(r"^checkpoint(\d+|_\d+_\d+|_last)\.pt$")
_LAYER = re.compile(r"^(.*?layers\.\d+)\.(.*)$")


@dataclass
class LRCTrajectory:
    """LRC coefficients per checkpoint, sorted by update number."""

    files: List[str] = field(default_factory=list)
    updates: List[int] = field(default_factory=list)
    epochs: List[Optional[int]] = field(default_factory=list)
    #: parameter name -> its value in each checkpoint (same order as ``updates``).
    values: "OrderedDict[str, List[float]]" = field(default_factory=OrderedDict)


def run_checkpoints(run_dir) -> List[Path]:
    """The checkpoints a fairseq run saved: ``checkpointN.pt``, ``checkpoint_E_U.pt`` and
    ``checkpoint_last.pt`` (``checkpoint_best.pt`` repeats one of them)."""
    return sorted(p for p in Path(run_dir).iterdir() if _RUN_CHECKPOINT.match(p.name))


def lrc_coefficients(model_state: dict) -> "OrderedDict[str, float]":
    return OrderedDict(
        (name, float(t.reshape(-1)[0])) for name, t in model_state.items() if name.endswith(SUFFIXES)
    )


def collect(paths: Sequence) -> LRCTrajectory:
    """Read the coefficients from each checkpoint; one entry per distinct update number (an
    image model's checkpoint, which records no update count, per epoch). Every checkpoint given
    is drawn or refused: ValueError for one without coefficients among others, for checkpoints
    of another model (other coefficients), of which some count updates and some not, or two at
    one update with different coefficients (two runs)."""
    rows: Dict[int, Tuple[str, Optional[int], Dict[str, float]]] = {}
    empty, first, by_updates = [], None, None
    for i, path in enumerate(paths):
        state = load_checkpoint(path)
        coeffs = lrc_coefficients(state["model"])
        if not coeffs:
            empty.append(str(path))
            continue
        if first is None:
            first = (str(path), list(coeffs))
        elif list(coeffs) != first[1]:
            raise ValueError(f"{path} holds other LRC coefficients than {first[0]} (another model): plot the"
                             " checkpoints of one model")
        updates = checkpoint_num_updates(state)
        epoch = checkpoint_epoch(state)
        if epoch is None and isinstance(state.get("epoch"), int):  # an image model's checkpoint: epochs from 0
            epoch = state["epoch"] + 1
        if by_updates is None:
            by_updates = (updates is not None, str(path))
        elif by_updates[0] != (updates is not None):
            raise ValueError(f"{path} and {by_updates[1]}: one records its update count and the other not"
                             " (a translation and an image model's checkpoint): plot the checkpoints of one run")
        key = updates if updates is not None else (epoch if epoch is not None else i)
        if key in rows and rows[key][2] != coeffs:
            raise ValueError(f"{path} and {rows[key][0]} are both at {'update' if updates is not None else 'epoch'}"
                             f" {key} with other coefficients (checkpoints of two runs): plot one run at a time")
        if key not in rows or Path(path).name != "checkpoint_last.pt":
            rows[key] = (str(path), epoch, coeffs)
    if not rows:
        raise ValueError(
            "no LRC coefficients (parameters named *skip_scale / *branch_scale) in "
            f"{len(paths)} checkpoint(s): not an SReT model, or trained with --no-lrc"
        )
    if empty:
        raise ValueError(f"{empty[0]}{f' and {len(empty) - 1} more' if len(empty) > 1 else ''}: no LRC coefficients"
                         f" (parameters named *skip_scale / *branch_scale), unlike {first[0]}: give the checkpoints"
                         " of one SReT run")
    traj = LRCTrajectory()
    names = list(next(iter(rows.values()))[2])
    for key in sorted(rows):
        path, epoch, coeffs = rows[key]
        traj.files.append(path)
        traj.updates.append(key)
        traj.epochs.append(epoch)
        for name in names:
            traj.values.setdefault(name, []).append(coeffs.get(name, float("nan")))
    return traj


def short_label(rest: str) -> str:
    """``recursive.layer.self_attn_residual.skip_scale`` -> ``self_attn.skip``."""
    parts = [p for p in rest.split(".") if p not in ("recursive", "layer", "residual")]
    parts = [p[: -len("_residual")] if p.endswith("_residual") else p for p in parts]
    label = ".".join(parts)
    return label.replace("skip_scale", "skip").replace("branch_scale", "branch")


def by_layer(names: Sequence[str]) -> "OrderedDict[str, List[Tuple[str, str]]]":
    """Group parameter names by layer (``encoder.layers.0``...): layer -> [(label, name)]."""
    groups: "OrderedDict[str, List[Tuple[str, str]]]" = OrderedDict()
    for name in names:
        m = _LAYER.match(name)
        layer, rest = (m.group(1), m.group(2)) if m else (name.rsplit(".", 2)[0], ".".join(name.rsplit(".", 2)[1:]))
        groups.setdefault(layer, []).append((short_label(rest), name))
    return groups


def format_table(traj: LRCTrajectory) -> str:
    """One block per layer: a row per checkpoint (update, epoch), a column per coefficient."""
    out = []
    for layer, items in by_layer(list(traj.values)).items():
        labels = [label for label, _ in items]
        widths = [max(7, len(label)) for label in labels]
        out.append(f"{layer}")
        out.append("  " + f"{'update':>8} {'epoch':>5}  " + "  ".join(f"{l:>{w}}" for l, w in zip(labels, widths)))
        for row, (update, epoch) in enumerate(zip(traj.updates, traj.epochs)):
            values = "  ".join(f"{traj.values[name][row]:>{w}.4f}" for (_, name), w in zip(items, widths))
            out.append("  " + f"{update:>8} {epoch if epoch is not None else '-':>5}  " + values)
        out.append("")
    return "\n".join(out)


def plot(traj: LRCTrajectory, output, title: str = "LRC coefficients", file_format: str = "png") -> Path:
    """One panel per layer: each coefficient against the update number; saved as ``file_format``
    (png, pdf or svg).
    Needs matplotlib (``pip install fairseq-sret[plot]``)."""
    plt = pyplot()
    groups = by_layer(list(traj.values))
    n = len(groups)
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharex=True)
    for ax, (layer, items) in zip(axes.flat, groups.items()):
        components = []  # one colour per residual connection, solid skip / dashed branch
        for label, name in items:
            component = label.rsplit(".", 1)[0]
            if component not in components:
                components.append(component)
            color = f"C{components.index(component) % 10}"
            style = "-" if label.endswith("skip") else "--"
            ax.plot(traj.updates, traj.values[name], style, color=color, marker="o", markersize=2.5, label=label)
        ax.set_title(layer, fontsize=9)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("update")
    for ax in axes[:, 0]:
        ax.set_ylabel("coefficient")
    fig.suptitle(f"{title} (solid: identity/skip, dashed: branch)", fontsize=10)
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120, format=file_format)
    plt.close(fig)
    return output
