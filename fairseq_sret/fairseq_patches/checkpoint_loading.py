"""The ``checkpoint_loading`` patch: ``fairseq.checkpoint_utils.load_checkpoint_to_cpu`` calls
``torch.load`` with torch's default ``weights_only=True`` (torch >= 2.6), which refuses the
``argparse.Namespace`` every fairseq checkpoint holds; and on a damaged or unsafe file it
surfaces torch's unpickling error, which names neither the file nor the cause. Patched: the
load runs under :func:`fairseq_sret.checkpoints.allowed_checkpoint_globals` (the one
allow-list policy), and failures raise ``CorruptCheckpointError`` or ``UnsafeCheckpointError``
naming the file.
"""

import argparse
import functools
import os
import tempfile

import torch
from fairseq import checkpoint_utils

from ..checkpoints import allowed_checkpoint_globals, check_checkpoint_file, clear_load_error, not_a_fairseq_checkpoint


def _clear_loading(load):
    @functools.wraps(load)
    def wrapper(path, *args, **kwargs):
        local = path if isinstance(path, str) and os.path.exists(path) else None
        if local is not None:
            check_checkpoint_file(local)  # also refuses a pipe, which would be read for ever
        try:
            with allowed_checkpoint_globals():
                return load(path, *args, **kwargs)
        except Exception as exc:
            clear = clear_load_error(path, exc) if local is not None else None
            if clear is None and local is not None and isinstance(exc, (KeyError, AttributeError)):
                clear = not_a_fairseq_checkpoint(local)
            if clear is None:
                raise
            # the chained torch/pickle traceback adds nothing for a damaged or refused file
            raise clear from None

    wrapper.sret_patch = "checkpoint_loading"
    return wrapper


def fairseq_loader_fails_on_own_checkpoints(load=None) -> bool:
    """Can ``load_checkpoint_to_cpu`` not read a checkpoint holding an argparse.Namespace,
    or does its error for a truncated file not name the file?"""
    load = load or checkpoint_utils.load_checkpoint_to_cpu
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "probe.pt")
        # the smallest state fairseq's upgrade code accepts, with a Namespace as in every checkpoint
        state = {
            "args": None, "cfg": None, "model": {},
            "optimizer_history": [{"num_updates": 0, "optimizer_name": "probe", "lr_scheduler_state": {}}],
            "extra_state": {"train_iterator": None, "probe": argparse.Namespace(probe=1)},
        }
        torch.save(state, path)
        try:
            load(path)
        except Exception:
            return True
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
        try:
            load(path)
        except Exception as exc:
            return path not in str(exc)
    return True  # a truncated file loaded without an error


def install(patch) -> None:
    patch.replace(checkpoint_utils, "load_checkpoint_to_cpu", _clear_loading(checkpoint_utils.load_checkpoint_to_cpu))
