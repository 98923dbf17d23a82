"""``torch.compile`` of the shared layers alone: each compiled once, the recursion left in Python.

Compiling a whole SReT model unrolls every recursion into one graph, so its compile time grows
with the layer applications and every new depth (:func:`~fairseq_sret.core.set_depth`) is a
new graph. Compiling each shared layer and NLL on its own (PyTorch's "regional compilation")
gives one graph per distinct application (the same attention groups and shapes), reused by
every application like it and by every depth.
"""

from typing import Any

import torch
from torch import nn

from .depth import recursive_layers


def compile_shared_layers(model: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Compile, in place, the shared layer and the NLLs of every :class:`Recursive` in ``model``
    (``module.compile(**compile_kwargs)``); returns ``model``, which runs as before.

    Every shared layer of one class shares its ``forward`` code, and Dynamo keeps a limited
    number of graphs per code object (``torch._dynamo.config.recompile_limit``); the limit
    is raised to the applications of the model when it is lower, so that no application
    falls back to eager mode.
    """
    recursives = list(recursive_layers(model))
    if not recursives:
        raise ValueError(f"{type(model).__name__} has no recursive layers to compile")
    applications = sum(len(r.schedule) for r in recursives)
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, applications)
    for recursive in recursives:
        recursive.layer.compile(**compile_kwargs)
        for nll in recursive.nlls or ():
            nll.compile(**compile_kwargs)
    return model
