"""What a vision training run records: its log lines, the processors and thread counts it ran
on, its random state (for ``--resume``), and the checks that a checkpoint resumed belongs to
the same run."""

import json
import random
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch

from fairseq_sret import json_text
from fairseq_sret.atomic_files import replacing
from ..hardware import cpu_model


# ----------------------------------------------------------------------------- random state
def rng_state() -> dict:
    """torch's, Python's and NumPy's random state (NumPy's keys as a tensor: the checkpoint
    allow-list reads tensors)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss]}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


# ----------------------------------------------------------------------------- where it ran
def training_processors(history: List[dict]) -> dict:
    """``cpu``: the processor the run trained on, and ``cpu_seconds_by_cpu``: its training CPU
    seconds by processor. A run resumed on another machine names every processor it ran on
    (joined by " + "), so that its seconds are never filed under one of them; epochs logged
    without one (before processors were recorded) count under "not recorded"."""
    by_cpu: Dict[str, float] = {}
    before = 0.0
    for stats in history:
        name = stats.get("cpu", "not recorded")
        by_cpu[name] = by_cpu.get(name, 0.0) + stats["cpu_seconds"] - before
        before = stats["cpu_seconds"]
    return {"cpu": " + ".join(by_cpu) if by_cpu else cpu_model(), "cpu_seconds_by_cpu": by_cpu}


def training_threads(history: List[dict]):
    """The torch thread count the run trained with (an int), or, for a run resumed with another
    ``--threads`` (the final weights depend on it), every count in the order used, joined by
    " + " (epochs logged before thread counts were recorded count as "not recorded")."""
    counts: List[object] = []
    for stats in history:
        count = stats.get("threads", "not recorded")
        if not counts or counts[-1] != count:
            counts.append(count)
    if len(counts) == 1 and isinstance(counts[0], int):
        return counts[0]
    return " + ".join(str(c) for c in counts) if counts else torch.get_num_threads()


# ----------------------------------------------------------------------------- the log
def log_text(history: List[dict]) -> str:
    """``log.jsonl``: one JSON line per epoch."""
    return "".join(json_text.dumps(h) + "\n" for h in history)


def append_log_line(log: str, stats: dict) -> None:
    """Add ``stats`` to the ``log.jsonl`` at ``log`` by a rewrite: a full disk never leaves
    part of a line (nor a kill: a line cut short is ended before the next)."""
    try:
        with open(log, encoding="utf-8") as f:
            logged = f.read()
    except FileNotFoundError:
        logged = ""
    if logged and not logged.endswith("\n"):
        logged += "\n"
    with replacing(log) as tmp:
        tmp.write_text(logged + json_text.dumps(stats) + "\n", encoding="utf-8")


def drop_log_lines_from(log: str, epoch: int) -> None:
    """Keep only the lines of the ``log.jsonl`` at ``log`` for epochs before ``epoch``: a
    resume trains ``epoch`` and the later ones again and logs them anew. A line that does not
    read goes too; a missing log stays missing."""
    try:
        with open(log, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return
    kept = []
    for line in lines:
        try:
            stats = json.loads(line)
        except ValueError:
            continue
        if isinstance(stats, dict) and isinstance(stats.get("epoch"), int) and stats["epoch"] < epoch:
            kept.append(line + "\n")
    if len(kept) != len(lines):
        with replacing(log) as tmp:
            tmp.write_text("".join(kept), encoding="utf-8")


def tested(output: Path) -> bool:
    """Whether the run in ``output`` has its test result (a ``result.json`` that reads: a
    damaged one, of a kill while it was written, is no result)."""
    try:
        result = json.loads((output / "result.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(result, dict) and "test" in result


# ----------------------------------------------------------------------------- resuming
def describe_difference(old: dict, new: dict) -> str:
    keys = sorted(set(old) | set(new))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k))


#: the options that make a ``sret-train-vision`` run what it is: a resume must give the ones it
#: was started with (``--epochs`` may grow; where and how fast it runs may change)
RUN_SETTINGS = (
    "model", "img_size", "drop_path", "batch_size", "lr", "min_lr", "warmup_lr", "warmup_epochs", "weight_decay",
    "label_smoothing", "clip_grad", "teacher", "distill_temperature", "mixed_depth", "seed", "max_steps_per_epoch",
)
#: input files of a run: given or not must stay as it was (their paths may differ)
RUN_INPUTS = ("teacher_logits", "teacher_checkpoint", "finetune")


def check_resumed_settings(resume: str, saved: dict, now: dict) -> None:
    """ValueError naming every :data:`RUN_SETTINGS` option whose value differs from the one
    the run in ``resume`` was started with (a checkpoint that records no options: unchecked)."""
    if not saved or not now:
        return
    changed = [f"--{key.replace('_', '-')} {saved.get(key)!r} -> {now.get(key)!r}"
               for key in RUN_SETTINGS if key in saved and saved.get(key) != now.get(key)]
    changed += [f"--{key.replace('_', '-')} {'given' if saved.get(key) else 'not given'} -> "
                f"{'given' if now.get(key) else 'not given'}"
                for key in RUN_INPUTS if key in saved and bool(saved.get(key)) != bool(now.get(key))]
    if changed:
        raise ValueError(f"{resume} belongs to a run started with other settings ({'; '.join(changed)}): resume it"
                         " with its own settings, or start a new run in another --output")


#: what a ``sret-train-vision`` checkpoint_last.pt holds that --resume needs
RESUME_KEYS = ("model", "optimizer", "scaler", "epoch")


def check_resumable(resume: str, state) -> None:
    """ValueError naming what ``resume`` is when it is not a ``checkpoint_last.pt`` of
    ``sret-train-vision`` (a ``checkpoint_best.pt``, bare weights, another command's checkpoint)."""
    if not isinstance(state, dict):
        why = "not a dict of training state"
    elif state.get("command", "sret-train-vision") != "sret-train-vision":
        why = f"written by {state['command']}"
    elif not isinstance(state.get("model"), dict):
        why = "model weights alone, no training state"
    else:
        missing = [key for key in RESUME_KEYS if key not in state]
        why = f"no {', '.join(missing)}: a checkpoint_best.pt or a model's weights" if missing else ""
    if why:
        raise ValueError(f"{resume} is not the checkpoint_last.pt of a sret-train-vision run ({why}): resume from"
                         " OUTPUT/checkpoint_last.pt, or start from its weights with --finetune")
