"""Build models by name: :func:`create_model` (with weights) and the timm registration.

When timm is installed, :func:`register_with_timm` makes every registered model available
as ``timm.create_model(name)``; it runs when ``fairseq_sret.vision`` is imported.
"""

import importlib.util
import sys
import types
import warnings
from typing import Callable, Optional

from torch import nn

from .registry import get_constructor, list_models
from .weights import load_checkpoint

# Keyword arguments that timm.create_model passes to every entry point; our constructors
# do not use them.
_TIMM_ONLY_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


def create_model(name: str, pretrained: bool = False, checkpoint_path: Optional[str] = None, **kwargs) -> nn.Module:
    """Build a registered model.

    Args:
        name: a name from :func:`list_models`, e.g. ``"sret_t"``.
        pretrained: there are no downloadable weights; pass ``checkpoint_path`` instead.
        checkpoint_path: a checkpoint to load, in our format or the official SReT format
            (see :func:`fairseq_sret.vision.load_checkpoint`); the position embedding is
            interpolated when the checkpoint was made at another resolution.
        **kwargs: overrides of the model configuration (``num_classes``, ``img_size``,
            ``drop_path_rate``, ``groups``, ...).
    """
    constructor = get_constructor(name)
    if pretrained and checkpoint_path is None:
        raise ValueError(
            "no downloadable weights are bundled; pass checkpoint_path= (an official SReT"
            " checkpoint or one saved by sret-train-vision)"
        )
    for key in _TIMM_ONLY_KWARGS:
        kwargs.pop(key, None)
    model = constructor(**kwargs)
    if checkpoint_path is not None:
        load_checkpoint(model, checkpoint_path)
    return model


# ---------------------------------------------------------------------------- timm
TIMM_MODULE = "fairseq_sret.vision.timm_entrypoints"


def _timm_entrypoint(name: str) -> Callable[..., nn.Module]:
    def entrypoint(pretrained: bool = False, **kwargs) -> nn.Module:
        return create_model(name, pretrained=pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__module__ = TIMM_MODULE
    entrypoint.__doc__ = get_constructor(name).__doc__
    return entrypoint


def register_with_timm() -> bool:
    """Register every model with timm, if timm is installed; returns whether it did.

    timm's ``register_model`` files an entry point under the name and module of the
    function it is given, so each model gets a small wrapper (module
    ``fairseq_sret.vision.timm_entrypoints``) that drops timm's bookkeeping arguments
    and calls :func:`create_model`.
    """
    try:
        if "timm" not in sys.modules and importlib.util.find_spec("timm") is None:
            return False
    except (ImportError, ValueError):  # sys.modules["timm"] = None hides it
        return False
    try:
        import timm.models as timm_models
    except ImportError:
        return False
    except Exception as err:  # a broken install (e.g. torchvision built for another torch)
        warnings.warn(f"timm is installed but cannot be imported ({err}); SReT models not registered with timm")
        return False
    timm_register = getattr(timm_models, "register_model", None)
    if timm_register is None:
        warnings.warn("this timm has no timm.models.register_model; SReT models not registered with timm")
        return False
    module = sys.modules.get(TIMM_MODULE)
    if module is None:
        module = types.ModuleType(TIMM_MODULE, "timm entry points of the fairseq-sret vision models")
        sys.modules[TIMM_MODULE] = module
    is_registered = getattr(timm_models, "is_model", None)
    for name in list_models():
        if hasattr(module, name) or (is_registered is not None and is_registered(name)):
            continue
        entrypoint = _timm_entrypoint(name)
        setattr(module, name, entrypoint)
        timm_register(entrypoint)
    return True
