"""Load fairseq checkpoints of our models with torch.load(weights_only=True).

torch >= 2.6 unpickles only allow-listed globals by default. fairseq checkpoints hold a
few plain Python objects besides tensors (the argparse namespace of the run, training
meters); we allow-list exactly those, instead of turning ``weights_only`` off.
"""

import argparse

import torch

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
