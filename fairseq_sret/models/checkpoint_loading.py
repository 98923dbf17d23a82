"""Load fairseq checkpoints of our models with torch.load(weights_only=True).

torch >= 2.6 unpickles only allow-listed globals by default. fairseq checkpoints hold a
few plain Python objects besides tensors (the argparse namespace of the run, training
meters); we allow-list exactly those, instead of turning ``weights_only`` off.

A damaged checkpoint file (empty, truncated, a failed CRC, not a checkpoint at all) makes
fairseq's loader (``fairseq-generate``, ``fairseq-interactive``, resuming
``fairseq-train``, ``from_pretrained``) raise one :class:`CorruptCheckpointError` that
names the file, instead of torch's unpickling errors (which for a non-checkpoint file
even suggest ``weights_only=False``).
"""

import argparse
import functools
import os
import pickle
import zipfile
from typing import Optional

import torch
from fairseq import checkpoint_utils

#: Non-tensor globals found in checkpoints written by ``fairseq-train`` for our models
#: (``torch.serialization.get_unsafe_globals_in_checkpoint`` lists them): the run's
#: argparse namespace. Everything else in them is tensors and builtin containers.
CHECKPOINT_SAFE_GLOBALS = [argparse.Namespace]


def allow_fairseq_checkpoint_globals() -> None:
    """Allow-list the checkpoint globals for ``torch.load(weights_only=True)`` (idempotent)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 has no allow-list (and does not default to weights_only)
        add(CHECKPOINT_SAFE_GLOBALS)


allow_fairseq_checkpoint_globals()


# ---------------------------------------------------------------- damaged files
class CorruptCheckpointError(RuntimeError):
    """A checkpoint file that is empty, truncated or damaged."""


def _damage(path: str) -> Optional[str]:
    """Why the file at ``path`` cannot be a sound checkpoint, or None if no damage is seen.

    torch writes checkpoints as zip archives with a CRC-32 per record; a truncated archive
    has no end record and a damaged record fails its CRC (torch itself does not check it:
    a flipped byte in tensor data would load silently).
    """
    if not os.path.isfile(path):
        return None  # missing files and remote paths: fairseq's own errors
    if os.path.getsize(path) == 0:
        return "the file is empty"
    with open(path, "rb") as f:
        magic = f.read(4)
    if not zipfile.is_zipfile(path):
        if magic == b"PK\x03\x04":
            return "the zip archive has no end record: the file was cut short"
        return None  # a legacy (pre-zip) torch pickle: torch.load judges it
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        return f"unreadable zip archive: {exc}"
    if bad is not None:
        return f"record {bad!r} fails its CRC-32 check"
    return None


def _load_error_reason(exc: BaseException) -> Optional[str]:
    """The reason for a torch.load failure that means a damaged file, else None."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, EOFError):
        return "unexpected end of file"
    if isinstance(exc, pickle.UnpicklingError) and "Unsupported global" not in str(exc):
        return f"not a torch checkpoint: {message[:200]}"
    if isinstance(exc, RuntimeError) and "PytorchStreamReader" in message:
        return message.split(". This is an internal miniz error")[0][:200]
    return None


def check_checkpoint_file(path) -> None:
    """Raise :class:`CorruptCheckpointError` naming ``path`` if the file is visibly damaged."""
    reason = _damage(str(path))
    if reason is not None:
        raise CorruptCheckpointError(_message(path, reason))


def _message(path, reason: str) -> str:
    return (
        f"checkpoint file {path} is truncated or corrupted ({reason}); copy or save it again"
        " (an interrupted save or transfer leaves such files)"
    )


def _with_clear_errors(load):
    """Wrap fairseq's ``load_checkpoint_to_cpu``: damaged files give one clear error."""
    if getattr(load, "sret_clear_errors", False):
        return load

    @functools.wraps(load)
    def wrapper(path, *args, **kwargs):
        local = path if isinstance(path, str) and os.path.isfile(path) else None
        if local is not None:
            check_checkpoint_file(local)
        try:
            return load(path, *args, **kwargs)
        except (EOFError, pickle.UnpicklingError, RuntimeError) as exc:
            reason = _load_error_reason(exc)
            if reason is None:
                raise
            # the chained torch/pickle traceback adds nothing for a damaged file
            raise CorruptCheckpointError(_message(path, reason)) from None

    wrapper.sret_clear_errors = True
    return wrapper


checkpoint_utils.load_checkpoint_to_cpu = _with_clear_errors(checkpoint_utils.load_checkpoint_to_cpu)
