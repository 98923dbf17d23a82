"""Checkpoint files without fairseq: safe loading, damage checks, finding the last N,
averaging, saving. fairseq-train's checkpoints of the translation models, and the vision
checkpoints and the lab's run files, which are read through the same allow-list.

**One allow-list policy.** fairseq checkpoints hold the run's ``argparse.Namespace`` and,
after a training with ``--eval-bleu``, numpy arrays (the BLEU counts of its metrics), besides
tensors (``torch.serialization.get_unsafe_globals_in_checkpoint`` lists these globals). A
numpy array is data: its elements go through the same restricted unpickler. Every load here
(and fairseq's own loader, through :mod:`fairseq_sret.fairseq_patches`) runs ``torch.load(weights_only=True)`` inside :func:`allowed_checkpoint_globals`, which
allows exactly :data:`CHECKPOINT_SAFE_GLOBALS` for the duration of the call; nothing is
allow-listed process-wide and ``weights_only`` is never turned off.

**Clear errors.** A file that is empty, truncated or damaged raises
:class:`CorruptCheckpointError`; a file that holds other Python objects raises
:class:`UnsafeCheckpointError`, which names them and says how to load a trusted file.
Both name the file.

fairseq's pip package does not ship ``scripts/average_checkpoints.py``; averaging here is
our own implementation of the same operation (parameter-wise mean of the last N epoch or
update checkpoints; the rest of the state - config, optimizer history, ... - is taken from
the newest checkpoint).
"""

import argparse
import collections
import contextlib
import copy
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch

from .atomic_files import replacing

#: The non-tensor globals fairseq-train writes into checkpoints: the run's argparse namespace,
#: and numpy arrays (fairseq's BLEU validation logs its n-gram counts as arrays, and the metrics
#: are saved with the training state).
CHECKPOINT_SAFE_GLOBALS = [
    argparse.Namespace, np.ndarray, np.dtype, getattr(np, "_core", getattr(np, "core", None)).multiarray._reconstruct,
    *sorted({type(np.dtype(code)) for code in "?" + np.typecodes["AllInteger"] + np.typecodes["AllFloat"]},
            key=lambda t: t.__name__),  # the class of each numeric dtype (numpy >= 1.25 pickles it)
]

EPOCH_PATTERN = re.compile(r"^checkpoint(\d+)\.pt$")
UPDATE_PATTERN = re.compile(r"^checkpoint_\d+_(\d+)\.pt$")


# ---------------------------------------------------------------- allow-list
@contextlib.contextmanager
def allowed_checkpoint_globals() -> Iterator[None]:
    """Allow :data:`CHECKPOINT_SAFE_GLOBALS` for ``torch.load(weights_only=True)`` inside the block.

    Only what is not allowed yet is added, and only that is removed afterwards, so an
    allow-listing made elsewhere survives. (torch < 2.4 has no allow-list.)
    """
    safe_globals = getattr(torch.serialization, "safe_globals", None)
    if safe_globals is None:
        yield
        return
    allowed = torch.serialization.get_safe_globals()
    missing = [g for g in CHECKPOINT_SAFE_GLOBALS if g not in allowed]
    if not missing:
        yield
        return
    with safe_globals(missing):
        yield


# ---------------------------------------------------------------- errors
class CorruptCheckpointError(RuntimeError):
    """A checkpoint file that is empty, truncated or damaged."""


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint that holds Python objects outside the allow-list (refused for safety)."""

    def __init__(self, path, unsafe_globals: Sequence[str]):
        self.path, self.unsafe_globals = str(path), list(unsafe_globals)
        names = ", ".join(self.unsafe_globals) or "(torch could not list them)"
        super().__init__(
            f"checkpoint file {path} was refused for safety: it holds Python objects that are"
            f" not allow-listed for torch.load(weights_only=True): {names}. Loading them could"
            " run their code. fairseq checkpoints hold only tensors, an argparse.Namespace and numpy arrays."
            " If you trust the file and its source, allow exactly these objects before"
            " loading it: torch.serialization.add_safe_globals([...]) with the classes or"
            " functions named above (or the context manager torch.serialization.safe_globals);"
            " never pass weights_only=False for a file you did not make."
        )


def _damage(path: str) -> Optional[str]:
    """Why the file at ``path`` cannot be a sound checkpoint, or None if no damage is seen.

    torch writes checkpoints as zip archives with a CRC-32 per record; a truncated archive
    has no end record and a damaged record fails its CRC (torch itself does not check it:
    a flipped byte in tensor data would load silently).
    """
    if not os.path.isfile(path):
        return None  # missing files and remote paths: the caller's own errors
    if os.path.getsize(path) == 0:
        return "the file is empty"
    with open(path, "rb") as f:
        magic = f.read(4)
    if not zipfile.is_zipfile(path):
        if magic == b"PK\x03\x04":
            return "the zip archive has no end record: the file was cut short"
        if not magic.startswith(b"\x80"):  # every pickle torch ever wrote opens with PROTO
            return "neither a zip archive nor a pickle: not a torch checkpoint"
        return None  # a legacy (pre-zip) torch pickle: torch.load judges it
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        return f"unreadable zip archive: {exc}"
    if bad is not None:
        return f"record {bad!r} fails its CRC-32 check"
    return None


def _corrupt_message(path, reason: str) -> str:
    return (
        f"checkpoint file {path} is truncated or corrupted ({reason}); copy or save it again"
        " (an interrupted save or transfer leaves such files)"
    )


def check_checkpoint_file(path) -> None:
    """Raise :class:`CorruptCheckpointError` naming ``path`` if the file is visibly damaged, or
    is no file at all (a folder; a pipe or device, which torch would wait on for ever)."""
    if os.path.exists(path) and not os.path.isfile(path):
        kind = "a folder" if os.path.isdir(path) else "a pipe or device (reading it waits for a writer)"
        raise CorruptCheckpointError(f"{path} is {kind}, not a checkpoint file: give the path of a checkpoint")
    reason = _damage(str(path))
    if reason is not None:
        raise CorruptCheckpointError(_corrupt_message(path, reason))


def _is_refused_global(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, pickle.UnpicklingError) and (
        "Unsupported global" in text or "GLOBAL" in text and "weights_only" in text
        or "allowlisted via `add_safe_globals`" in text
    )


def unsafe_globals_in(path) -> List[str]:
    """The globals of a checkpoint file that are not allow-listed (read without unpickling)."""
    lister = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if lister is None:
        return []
    try:
        with allowed_checkpoint_globals():
            found = lister(str(path))
    except Exception:  # a file torch cannot even list: the load error stands
        return []
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in CHECKPOINT_SAFE_GLOBALS}
    return [g for g in found if g not in allowed]


def _raised_by_unpickler(exc: BaseException) -> bool:
    """Did ``exc`` come from torch's unpickler (a damaged stream), not from code after the load?"""
    tb = exc.__traceback__
    while tb is not None:
        if os.path.basename(tb.tb_frame.f_code.co_filename) in ("_weights_only_unpickler.py", "pickle.py"):
            return True
        tb = tb.tb_next
    return False


def clear_load_error(path, exc: BaseException) -> Optional[Exception]:
    """The error to raise instead of a ``torch.load`` failure on ``path``, or None to re-raise it.

    Refused globals give :class:`UnsafeCheckpointError` (naming them); an end of file, a
    failed unpickling or a broken zip stream give :class:`CorruptCheckpointError`.
    """
    if _is_refused_global(exc):
        return UnsafeCheckpointError(path, unsafe_globals_in(path))
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    reason = None
    if isinstance(exc, EOFError):
        reason = "unexpected end of file"
    elif isinstance(exc, pickle.UnpicklingError):
        reason = f"not a torch checkpoint: {message[:200]}"
    elif isinstance(exc, (KeyError, IndexError, ValueError)) and _raised_by_unpickler(exc):
        reason = f"damaged pickle stream ({type(exc).__name__}: {message[:200]})"
    elif isinstance(exc, RuntimeError) and "PytorchStreamReader" in message:
        reason = message.split(". This is an internal miniz error")[0][:200]
    return None if reason is None else CorruptCheckpointError(_corrupt_message(path, reason))


def not_a_fairseq_checkpoint(path) -> Optional[Exception]:
    """A ``ValueError`` naming ``path`` when it holds no fairseq training state (no ``cfg`` or
    ``args``: an image model's checkpoint, a bare state dict), else None."""
    try:
        state = load_checkpoint(path)
    except Exception:
        return None
    if isinstance(state, dict) and (state.get("cfg") is not None or state.get("args") is not None):
        return None
    what = "a bare state dict" if not isinstance(state, dict) or "model" not in state else "no fairseq configuration"
    if isinstance(state, dict) and isinstance(state.get("model_name"), str):
        what = f"an image model's checkpoint ({state['model_name']}, from sret-train-vision)"
    return ValueError(f"{path} is not a checkpoint of fairseq-train ({what}): give fairseq a checkpoint that"
                      " fairseq-train saved")


# ---------------------------------------------------------------- loading
def load_checkpoint(path, mmap: bool = False) -> dict:
    """``torch.load`` a fairseq checkpoint onto the CPU with ``weights_only=True``; with ``mmap``
    the tensors are mapped from the file, read only when used (for a caller that reads the
    checkpoint's other state).

    Raises :class:`CorruptCheckpointError` or :class:`UnsafeCheckpointError` (see above).
    """
    check_checkpoint_file(path)
    try:
        with allowed_checkpoint_globals():
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
    except (EOFError, pickle.UnpicklingError, RuntimeError, KeyError, IndexError, ValueError) as exc:
        clear = clear_load_error(path, exc)
        if clear is None:
            raise
        raise clear from None


def mismatch_summary(missing: Sequence[str], unexpected: Sequence[str], shapes: Sequence[tuple]) -> str:
    """Why weights do not load strictly, in one line: how many keys are missing, unexpected or
    of another shape (``(name, shape in the checkpoint, shape in the model)``), the first of each."""
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing (e.g. {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
    if shapes:
        name, saved, built = shapes[0]
        parts.append(f"{len(shapes)} of another shape (e.g. {name}: {saved} in the checkpoint, {built} in the model)")
    return "; ".join(parts)


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


#: model options that change what the weights compute without changing their names or shapes:
#: checkpoints that differ in one are models of different kinds, whose mean is neither
MODEL_KIND_OPTIONS = ("arch", "activation_fn", "encoder_attention_heads", "decoder_attention_heads",
                      "encoder_normalize_before", "decoder_normalize_before", "encoder_groups", "decoder_groups",
                      "encoder_partition", "decoder_partition", "encoder_recursions", "decoder_recursions",
                      "encoder_trained_recursions", "decoder_trained_recursions", "attention_layer")


def model_kind(state: dict) -> Dict[str, object]:
    """The :data:`MODEL_KIND_OPTIONS` a fairseq checkpoint's model configuration gives."""
    options = (state.get("cfg") or {}).get("model") or state.get("args")
    if options is None:
        return {}
    read = options.get if hasattr(options, "get") else lambda key, default=None: getattr(options, key, default)
    return {key: read(key, None) for key in MODEL_KIND_OPTIONS if read(key, None) is not None}


def _check_same_kind(path, kind: Dict[str, object], first, first_kind: Dict[str, object]) -> None:
    differ = sorted(key for key in set(kind) & set(first_kind) if str(kind[key]) != str(first_kind[key]))
    if differ:
        shown = ", ".join(f"{key} {kind[key]!r} against {first_kind[key]!r}" for key in differ)
        raise ValueError(f"{path} is another kind of model than {first} ({shown}): the mean of their weights is"
                         " neither model; average checkpoints of one model")


#: sections of a fairseq-train checkpoint's configuration that one run keeps from its first
#: checkpoint to its last (its schedule's caps and its paths may change when it is resumed)
RUN_SECTIONS = ("model", "criterion", "optimizer", "lr_scheduler")


def _read(options, key, default=None):
    if options is None:
        return default
    return options.get(key, default) if hasattr(options, "get") else getattr(options, key, default)


def run_identity(state: dict) -> Dict[str, object]:
    """What a checkpoint records of the run that saved it: its seed, the data it trained on
    and the settings a run keeps throughout. Checkpoints that differ in one are of different
    runs, whose mean is no model either run trained. Read from sret-train-cifar's ``settings``
    and ``data``, sret-train-vision's ``args`` and ``data``, fairseq-train's configuration
    (``common.seed`` and :data:`RUN_SECTIONS`; the dictionaries are checked on their own)."""
    identity: Dict[str, object] = {}
    if isinstance(state.get("settings"), dict):  # sret-train-cifar
        settings = state["settings"]
        identity.update(seed=settings.get("seed"), data=(state.get("data") or {}).get("fingerprints"),
                        settings=repr(sorted((k, repr(v)) for k, v in settings.items() if k != "seed")))
    elif "data" in state or "classes" in state:  # sret-train-vision
        identity.update(seed=_read(state.get("args"), "seed"), data=state.get("data"), classes=state.get("classes"))
    else:
        cfg = state.get("cfg")
        identity["seed"] = _read(_read(cfg, "common"), "seed", _read(state.get("args"), "seed"))
        for section in RUN_SECTIONS:
            value = _read(cfg, section)
            if value is not None:
                identity[section] = str(value)
    return {key: value for key, value in identity.items() if value is not None}


def run_id(identity: Dict[str, object]) -> str:
    """A short digest of a :func:`run_identity`, recorded with an average's inputs."""
    import hashlib

    return hashlib.sha256(repr(sorted((k, repr(v)) for k, v in identity.items())).encode()).hexdigest()[:16]


def _check_same_run(path, identity: Dict[str, object], first, first_identity: Dict[str, object]) -> None:
    differ = sorted(key for key in set(identity) | set(first_identity) if identity.get(key) != first_identity.get(key))
    if differ:
        shown = "; ".join(f"{key} {identity.get(key)!r} against {first_identity.get(key)!r}"
                          if key in ("seed", "data", "classes") else f"its {key} settings" for key in differ)
        raise ValueError(f"{path} is of another run than {first} ({shown}): the mean of two runs' weights is"
                         " neither model; average the checkpoints of one run")


def average_checkpoints(paths: Sequence) -> dict:
    """Average the ``model`` tensors of the given checkpoints.

    Returns the state dict of the newest of them (the most updates; the first one on a
    tie) with its ``model`` replaced by the mean, which keeps the state dict's metadata (the
    dictionary fingerprints that loading checks). Floating tensors are accumulated in float64
    and cast back to their dtype; integer tensors get the floor of the mean, as fairseq's
    averaging script does. Raises ValueError for a file given twice (it would count twice), for
    checkpoints trained with different dictionaries, for models of different kinds
    (:data:`MODEL_KIND_OPTIONS`) and for checkpoints of different runs (:func:`run_identity`:
    another seed, other data, other settings). The average records its inputs, each path with
    its run's seed and :func:`run_id`, as ``averaged_from``.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    seen: Dict[Path, object] = {}
    for path in paths:
        resolved = Path(path).resolve()
        if resolved in seen:
            also = "" if str(seen[resolved]) == str(path) else f" (also as {seen[resolved]})"
            raise ValueError(f"{path}: given twice{also}; each checkpoint counts once in the average")
        seen[resolved] = path
    new_state, newest, keys = None, None, None
    metadata, metadata_of = None, None
    sums: "collections.OrderedDict[str, torch.Tensor]" = collections.OrderedDict()
    dtypes: Dict[str, torch.dtype] = {}
    kinds, identities = [], []
    for path in paths:
        state = load_checkpoint(path)
        kinds.append(model_kind(state))
        _check_same_kind(path, kinds[-1], paths[0], kinds[0])
        identities.append(run_identity(state))
        _check_same_run(path, identities[-1], paths[0], identities[0])
        inside = [seen[Path(source.get("path", ""))] for source in state.get("averaged_from") or []
                  if isinstance(source, dict) and Path(source.get("path", "")) in seen]
        if inside:
            raise ValueError(f"{path} is an average of {inside[0]}, also given: it would count twice; average the"
                             " run's checkpoints themselves")
        model = state.pop("model")
        updates = checkpoint_num_updates(state)
        if new_state is None or (updates is not None and (newest is None or updates > newest)):
            new_state, newest = state, updates
        fingerprints = _fingerprints(model)
        if fingerprints:
            if metadata is None:
                metadata, metadata_of = copy.deepcopy(model._metadata), (path, fingerprints)
            elif fingerprints != metadata_of[1]:
                raise ValueError(
                    f"{path} was trained with other dictionaries than {metadata_of[0]} ({_describe(fingerprints)}"
                    f" against {_describe(metadata_of[1])}): checkpoints of different data-bins do not average")
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
    if metadata is not None:
        averaged._metadata = metadata
    new_state["model"] = averaged
    new_state["averaged_from"] = [{"path": str(Path(path).resolve()), "seed": identity.get("seed"),
                                   "run": run_id(identity)} for path, identity in zip(paths, identities)]
    return new_state


def _fingerprints(model_state) -> Dict[str, str]:
    """The dictionary fingerprints a state dict's metadata records (module prefix -> its
    ``*_dictionary_fingerprint`` entries); empty for checkpoints that record none."""
    recorded = getattr(model_state, "_metadata", None) or {}
    return {f"{prefix}.{key}" if prefix else key: value for prefix, entries in recorded.items()
            for key, value in (entries or {}).items() if key.endswith("_dictionary_fingerprint")}


def _describe(fingerprints: Dict[str, str]) -> str:
    return ", ".join(f"{key.rsplit('.', 1)[-1].replace('_dictionary_fingerprint', '')} {value}"
                     for key, value in sorted(fingerprints.items()))


def save_checkpoint(state: dict, path) -> Path:
    """Write ``state`` to ``path`` atomically (a temporary file, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        torch.save(state, str(tmp))
    return path
