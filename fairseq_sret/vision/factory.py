"""Build models by name: :func:`create_model` (with weights) and the timm registration.

When timm is installed, :func:`register_with_timm` makes every registered model a timm model
(:mod:`fairseq_sret.vision.timm_models`), so ``timm.create_model(name)`` works; it runs when
``fairseq_sret.vision`` is imported.
"""

import importlib.util
import math
import sys
import warnings
from numbers import Integral, Real
from typing import Optional

from torch import nn

from .registry import get_constructor, get_pretrained_cfg
from .weights import load_checkpoint


def create_model(name: str, pretrained: bool = False, checkpoint_path: Optional[str] = None, **kwargs) -> nn.Module:
    """Build a registered model.

    Args:
        name: a name from :func:`list_models`, e.g. ``"sret_t"``.
        pretrained: there are no downloadable weights; pass ``checkpoint_path`` instead.
        checkpoint_path: a checkpoint to load, in our format or the official SReT format
            (see :func:`fairseq_sret.vision.load_checkpoint`); the position embedding is
            interpolated when the checkpoint was made at another resolution.
        **kwargs: overrides of the model configuration (``num_classes``, ``img_size``,
            ``drop_path_rate``, ``groups``, ...) and ``device`` / ``dtype``.

    The model's ``pretrained_cfg`` (alias ``default_cfg``) is the config registered with it
    (input size, crop, normalisation), as timm sets it.
    """
    constructor = get_constructor(name)
    check_model_kwargs(kwargs)
    if pretrained and checkpoint_path is None:
        raise ValueError(
            "no downloadable weights are bundled; pass checkpoint_path= (an official SReT"
            " checkpoint or one saved by sret-train-vision)"
        )
    model = constructor(**kwargs)
    model.pretrained_cfg = model.default_cfg = get_pretrained_cfg(name)
    if checkpoint_path is not None:
        load_checkpoint(model, checkpoint_path)
    return model


def _count(value, least: int) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= least


def _rate(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value < 1


def _positive(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0


#: the overrides every model takes, with what each must be (the model's own configuration
#: checks the rest, and how they fit together)
_KWARG_RULES = {
    "num_classes": (lambda v: _count(v, 0), "an integer >= 0 (0: no classifier)"),
    "in_chans": (lambda v: _count(v, 1), "an integer >= 1"),
    "recursions": (lambda v: _count(v, 1), "an integer >= 1"),
    "img_size": (lambda v: _count(v, 1) or (isinstance(v, (tuple, list)) and len(v) == 2
                                              and all(_count(x, 1) for x in v)),
                 "an integer >= 1 or a pair of them (height, width)"),
    "drop_rate": (_rate, "in [0, 1)"),
    "attn_drop_rate": (_rate, "in [0, 1)"),
    "drop_path_rate": (_rate, "in [0, 1)"),
    "mlp_ratio": (_positive, "a finite number > 0"),
    "norm_eps": (_positive, "a finite number > 0"),
}


def check_model_kwargs(kwargs: dict) -> None:
    """The one check of :func:`create_model`'s overrides before a model is built: a ValueError
    naming the first one of the wrong type or out of range."""
    for name, value in kwargs.items():
        rule = _KWARG_RULES.get(name)
        if rule is not None and not rule[0](value):
            raise ValueError(f"create_model: {name} must be {rule[1]}, got {value!r}")


def register_with_timm() -> bool:
    """Register every model with timm, if timm is installed; returns whether it did.

    Each model gets a timm entry point and its pretrained config
    (:mod:`fairseq_sret.vision.timm_models`); models registered later are added by a second
    call. A timm that cannot be imported (e.g. a torchvision built for another torch) gives a
    warning and no registration.
    """
    try:
        if "timm" not in sys.modules and importlib.util.find_spec("timm") is None:
            return False
    except (ImportError, ValueError):  # sys.modules["timm"] = None hides it
        return False
    try:
        import timm.models  # noqa: F401
    except ImportError:
        return False
    except Exception as err:  # a broken install (e.g. torchvision built for another torch)
        warnings.warn(f"timm is installed but cannot be imported ({err}); SReT models not registered with timm")
        return False
    try:
        from . import timm_models
    except ImportError as err:  # a timm without build_model_with_cfg / generate_default_cfgs
        warnings.warn(f"this timm lacks what the SReT models need ({err}); they are not registered with timm")
        return False
    timm_models.register_models()
    return True
