"""The vision models as timm models (imported by :func:`~fairseq_sret.vision.register_with_timm`
when timm is installed).

Every registered model gets a timm entry point of the same name and its pretrained config, so
``timm.create_model(name, ...)`` builds it through timm's ``build_model_with_cfg``, as timm's
own models: ``pretrained_cfg`` / ``default_cfg``, ``features_only=True`` with ``out_indices``
(``forward_intermediates``), and weights through timm's loading path:
``timm.create_model("sret_t", pretrained=True, pretrained_cfg_overlay=dict(file="SReT_T.pth"))``
reads official SReT checkpoints and ours (:func:`~fairseq_sret.vision.weights.checkpoint_filter_fn`).
timm lists them as the module ``timm_models`` (``timm.list_models(module="timm_models")``).
"""

from typing import Callable

from timm.models import build_model_with_cfg, generate_default_cfgs, is_model, register_model
from torch import nn

from .registry import get_constructor, get_pretrained_cfg, list_models
from .weights import checkpoint_filter_fn

#: timm reads a module's pretrained configs from this dict when it registers an entry point
default_cfgs = {}


def _entrypoint(name: str) -> Callable[..., nn.Module]:
    constructor = get_constructor(name)

    def entrypoint(pretrained: bool = False, **kwargs) -> nn.Module:
        # features_only=True without out_indices: the last three stages (SReT: all) or layers
        return build_model_with_cfg(
            constructor, name, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
            feature_cfg=dict(feature_cls="getter", out_indices=3), **kwargs,
        )

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = constructor.__doc__
    return entrypoint


def register_models() -> None:
    """Register the models that timm does not know yet (with their pretrained configs)."""
    for name in list_models():
        if name in default_cfgs or is_model(name):
            continue
        default_cfgs.update(generate_default_cfgs({name: get_pretrained_cfg(name)}))
        globals()[name] = register_model(_entrypoint(name))
