"""fairseq checkpoints without fairseq: safe loading, finding the last N, averaging.

fairseq's pip package does not ship ``scripts/average_checkpoints.py``; this is our own
implementation of the same operation (parameter-wise mean of the last N epoch or update
checkpoints; the rest of the state - config, optimizer history, ... - is taken from the
newest checkpoint), usable from Python and through ``scripts/average_checkpoints.py``.

Checkpoints are loaded with ``torch.load(weights_only=True)``; the only non-tensor global
fairseq-train writes (the run's ``argparse.Namespace``) is allow-listed for the duration
of the call, never globally, and ``weights_only`` is never turned off.
"""

import argparse
import collections
import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

#: Non-tensor classes that fairseq checkpoints contain (the argparse namespace of the run).
CHECKPOINT_SAFE_GLOBALS = [argparse.Namespace]

EPOCH_PATTERN = re.compile(r"^checkpoint(\d+)\.pt$")
UPDATE_PATTERN = re.compile(r"^checkpoint_\d+_(\d+)\.pt$")


def load_checkpoint(path) -> dict:
    """``torch.load`` a fairseq checkpoint onto the CPU with ``weights_only=True``."""
    safe_globals = getattr(torch.serialization, "safe_globals", None)
    try:
        if safe_globals is None:  # torch < 2.4: no allow-list; weights_only=False is the default there
            return torch.load(str(path), map_location="cpu")
        # Only add what is not allowed yet: leaving the context manager removes what it
        # added, which would also undo an allow-listing done elsewhere (e.g. by our plugin).
        allowed = torch.serialization.get_safe_globals()
        missing = [g for g in CHECKPOINT_SAFE_GLOBALS if g not in allowed]
        if not missing:
            return torch.load(str(path), map_location="cpu", weights_only=True)
        with safe_globals(missing):
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle.UnpicklingError, with torch's explanation
        if "Unsupported global" in str(exc) or "weights_only" in str(exc):
            raise RuntimeError(
                f"{path}: the checkpoint holds Python objects that are not allow-listed for "
                "torch.load(weights_only=True); torch.serialization.get_unsafe_globals_in_checkpoint"
                f"({str(path)!r}) lists them. Original error: {str(exc).splitlines()[-1][:500]}"
            ) from exc
        raise


def checkpoint_num_updates(state: dict) -> Optional[int]:
    """The update count a fairseq checkpoint was saved at (None if it does not say)."""
    history = state.get("optimizer_history") or []
    if history and "num_updates" in history[-1]:
        return int(history[-1]["num_updates"])
    return None


def checkpoint_epoch(state: dict) -> Optional[int]:
    iterator = (state.get("extra_state") or {}).get("train_iterator") or {}
    return iterator.get("epoch")


def last_n_checkpoints(directory, n: int, by: str = "epoch", upper_bound: Optional[int] = None) -> List[Path]:
    """The newest ``n`` checkpoints of a run, newest first.

    ``by="epoch"``: ``checkpointEPOCH.pt``; ``by="update"``: ``checkpoint_EPOCH_UPDATE.pt``.
    ``upper_bound`` ignores checkpoints after that epoch / update.
    """
    if by not in ("epoch", "update"):
        raise ValueError(f"by must be 'epoch' or 'update', not {by!r}")
    pattern = EPOCH_PATTERN if by == "epoch" else UPDATE_PATTERN
    found = []
    for name in os.listdir(directory):
        m = pattern.match(name)
        if m:
            number = int(m.group(1))
            if upper_bound is None or number <= upper_bound:
                found.append((number, Path(directory) / name))
    found.sort(reverse=True)
    if len(found) < n:
        raise ValueError(f"found {len(found)} {by} checkpoints in {directory}, need {n}")
    return [p for _, p in found[:n]]


def average_checkpoints(paths: Sequence) -> dict:
    """Average the ``model`` tensors of the given checkpoints.

    Returns the state dict of the newest of them (the most updates; the first one on a
    tie) with its ``model`` replaced by the mean.
    Floating tensors are accumulated in float64 and cast back to their dtype; integer
    tensors get the floor of the mean, as fairseq's averaging script does.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    new_state, newest, keys = None, None, None
    sums: "collections.OrderedDict[str, torch.Tensor]" = collections.OrderedDict()
    dtypes: Dict[str, torch.dtype] = {}
    for path in paths:
        state = load_checkpoint(path)
        model = state.pop("model")
        updates = checkpoint_num_updates(state)
        if new_state is None or (updates is not None and (newest is None or updates > newest)):
            new_state, newest = state, updates
        if keys is None:
            keys = list(model.keys())
        elif set(model.keys()) != set(keys):
            raise KeyError(f"{path}: parameters {sorted(set(keys) ^ set(model.keys()))[:5]} differ")
        for k, p in model.items():
            if k not in sums:
                dtypes[k] = p.dtype
                sums[k] = p.detach().to(torch.float64 if p.is_floating_point() else torch.int64).clone()
            else:
                if p.shape != sums[k].shape:
                    raise ValueError(f"{path}: {k} has shape {tuple(p.shape)}, expected {tuple(sums[k].shape)}")
                sums[k] += p.detach().to(sums[k].dtype)
    n = len(paths)
    averaged = collections.OrderedDict()
    for k, total in sums.items():
        mean = total / n if total.is_floating_point() else torch.div(total, n, rounding_mode="floor")
        averaged[k] = mean.to(dtypes[k])
    new_state["model"] = averaged
    return new_state


def save_checkpoint(state: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, str(tmp))
    os.replace(tmp, path)
    return path
