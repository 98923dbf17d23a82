"""fairseq's JSON training log (``--log-format json``): epochs, validation losses, the
processes that trained a run, and where ``--patience`` stops it."""

import json
import re
import statistics
from typing import Dict, List, Optional, Sequence

_LOG_RECORD = re.compile(r"\| (train_inner|train|valid) \| (\{.*\})\s*$")
# fairseq's trainer, when a training process starts: from a checkpoint, or from scratch
_LOG_LOADED = re.compile(r"\| Loaded checkpoint .* \(epoch \d+ @ (\d+) updates\)\s*$")
_LOG_FRESH = re.compile(r"\| No existing checkpoint found ")
_UPDATE_KEYS = ("num_updates", "train_num_updates", "valid_num_updates")
_UPDATE_IN_RECORD = re.compile(r'"(?:train_|valid_)?num_updates": "?([0-9.]+)')


def process_start(line: str) -> Optional[int]:
    """The update a training process starts from when ``line`` is fairseq's line saying so
    (its checkpoint's, 0 from scratch); None for any other line."""
    loaded = _LOG_LOADED.search(line)
    if loaded:
        return int(loaded.group(1))
    return 0 if _LOG_FRESH.search(line) else None


def logged_update(line: str) -> Optional[int]:
    """The update count of a log record line (found without parsing its JSON), else None."""
    match = _LOG_RECORD.search(line)
    found = _UPDATE_IN_RECORD.search(match.group(2)) if match else None
    return int(float(found.group(1))) if found else None


def _number(value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        return value
    return int(number) if number.is_integer() and "." not in str(value) else number


def parse_training_log(text: str) -> dict:
    """Epoch records from a fairseq JSON log (``--log-format json``).

    Returns ``{"epochs": [{"epoch", "num_updates", "valid_loss", "seconds", "wps"}], "last":
    {latest train_inner record}, "starts": [{"from_update", "reached"}], "done": bool}``;
    ``seconds`` is fairseq's wall clock of the training, ``wps`` its target tokens per
    second. A resumed run's clock starts again at 0 in the log; the seconds here continue
    from the earlier processes' time. ``starts``: one per training process, the update it
    started from (its checkpoint's, 0 from scratch) and the highest update it logged.
    """
    epochs: Dict[int, dict] = {}
    last = {}
    starts: List[dict] = []
    offset, previous = 0.0, 0.0  # seconds of the earlier processes; the last train_wall seen
    for line in text.splitlines():
        start = process_start(line)
        if start is not None:
            starts.append({"from_update": start, "reached": None})
            continue
        match = _LOG_RECORD.search(line)
        if not match:
            continue
        kind = match.group(1)
        try:
            record = {k: _number(v) for k, v in json.loads(match.group(2)).items()}
        except json.JSONDecodeError:
            continue
        update = next((record[k] for k in _UPDATE_KEYS if isinstance(record.get(k), int)), None)
        if update is not None:
            if not starts:
                starts.append({"from_update": 0, "reached": None})
            starts[-1]["reached"] = max(update, starts[-1]["reached"] or 0)
        if kind == "train_inner":
            last = record
            continue
        epoch = int(record.get("epoch", 0))
        entry = epochs.setdefault(epoch, {"epoch": epoch})
        if kind == "valid":
            entry["valid_loss"] = record.get("valid_loss")
            entry["num_updates"] = record.get("valid_num_updates")
        else:
            wall = record.get("train_wall")
            if isinstance(wall, (int, float)):
                if wall < previous:
                    offset += previous
                previous = wall
                wall += offset
            entry["seconds"] = wall
            entry["wps"] = record.get("train_wps")
            entry.setdefault("num_updates", record.get("train_num_updates"))
    ordered = [epochs[e] for e in sorted(epochs)]
    return {"epochs": ordered, "last": last, "starts": starts, "done": "done training" in text}


def repeated_updates(starts: Sequence[dict]) -> int:
    """Updates trained more than once across a run's processes: a process that starts from
    a checkpoint older than the updates logged before trains those again. A lower bound,
    since fairseq logs the update count every ``--log-interval`` updates and at epoch ends."""
    repeated, highest = 0, 0
    for start in starts:
        reached = start["reached"] if start["reached"] is not None else start["from_update"]
        repeated += max(0, min(reached, highest) - start["from_update"])
        highest = max(highest, reached)
    return repeated


def stopping_epoch(curve: Sequence[dict], patience: int) -> Optional[int]:
    """The epoch at which ``--patience`` stops a run with this validation history
    (``[{"epoch", "valid_loss"}]``, in order), by fairseq's rule: ``patience`` validations in
    a row that do not improve on the best (lower) loss; None if it never does."""
    if patience <= 0:
        return None
    return next((point["epoch"] for point, without in _patience_counts(curve) if without >= patience), None)


def validations_without_improvement(curve: Sequence[dict]) -> int:
    """fairseq's ``--patience`` count after the last validation of ``curve``: how many in a
    row, ending there, have not improved on the best loss before them."""
    counts = [without for _, without in _patience_counts(curve)]
    return counts[-1] if counts else 0


def _patience_counts(curve: Sequence[dict]):
    """``(point, n)`` for each validation: n of them in a row, ending there, have not improved on the
    best (lower) loss before them (fairseq's ``--patience`` count after that validation)."""
    best, without = None, 0
    for point in curve:
        if best is None or point["valid_loss"] < best:
            best, without = point["valid_loss"], 0
        else:
            without += 1
        yield point, without


def training_summary(parsed: dict, patience: int = 0) -> dict:
    """Best valid loss, when it was reached (update, seconds), the training speed, and how
    many training processes the run took (``starts``) with the updates they repeated.

    With ``patience``, the run counts up to the epoch at which ``--patience`` stops it
    (:func:`stopping_epoch`, ``stopped_at_epoch``): a run trained past it (resumed by a fairseq
    that lost the count) is cut there, its last epoch kept as ``epochs_trained``."""
    validated = [e for e in parsed["epochs"] if isinstance(e.get("valid_loss"), (int, float))]
    stop = stopping_epoch(validated, patience)
    counted = [e for e in parsed["epochs"] if stop is None or e["epoch"] <= stop]
    epochs = [e for e in validated if stop is None or e["epoch"] <= stop]
    summary = {"epochs": len(counted), "curve": [
        {"epoch": e["epoch"], "update": e.get("num_updates"), "seconds": e.get("seconds"), "valid_loss": e["valid_loss"]}
        for e in epochs
    ]}
    if stop is not None:
        summary["stopped_at_epoch"] = stop
        if parsed["epochs"][-1]["epoch"] > stop:
            summary["epochs_trained"] = parsed["epochs"][-1]["epoch"]
    if epochs:
        best = min(epochs, key=lambda e: e["valid_loss"])
        summary.update(best_valid_loss=best["valid_loss"], best_epoch=best["epoch"],
                       best_update=best.get("num_updates"), seconds_to_best=best.get("seconds"))
        summary["updates"] = counted[-1].get("num_updates")
        summary["seconds"] = counted[-1].get("seconds")
    speeds = [e["wps"] for e in counted if isinstance(e.get("wps"), (int, float))]
    if speeds:
        summary["train_tokens_per_second"] = statistics.median(speeds)
    starts = parsed.get("starts") or []
    summary["starts"] = max(1, len(starts))
    summary["repeated_updates"] = repeated_updates(starts)
    return summary
