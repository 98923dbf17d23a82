"""The model registry: constructors register themselves with :func:`register_model`
(timm's convention: the function name is the model name). Building models by name,
with weights, and the timm registration are in :mod:`fairseq_sret.vision.factory`.
"""

import fnmatch
from typing import Callable, Dict, List, Optional

from torch import nn

_MODELS: Dict[str, Callable[..., nn.Module]] = {}

def register_model(fn: Callable[..., nn.Module] = None, *, name: Optional[str] = None):
    """Register a model constructor under ``name`` (default: the function name)."""

    def add(f):
        key = name or f.__name__
        if key in _MODELS and _MODELS[key] is not f:
            raise ValueError(f"a model named {key!r} is already registered")
        _MODELS[key] = f
        return f

    return add(fn) if fn is not None else add


def list_models(pattern: str = "*") -> List[str]:
    """Sorted names of the registered models matching a shell-style ``pattern``."""
    return sorted(n for n in _MODELS if fnmatch.fnmatchcase(n, pattern))


def is_model(name: str) -> bool:
    return name in _MODELS


def get_constructor(name: str) -> Callable[..., nn.Module]:
    """The constructor registered as ``name``; ValueError listing the names otherwise."""
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(list_models())}")
    return _MODELS[name]
