"""The model registry: constructors register themselves with :func:`register_model`
(timm's convention: the function name is the model name), each with its pretrained config
(input size, crop, normalisation, where the weights come from). Building models by name,
with weights, and the timm registration are in :mod:`fairseq_sret.vision.factory`.
"""

import fnmatch
from typing import Callable, Dict, List, Optional

from torch import nn

_MODELS: Dict[str, Callable[..., nn.Module]] = {}
_PRETRAINED_CFGS: Dict[str, dict] = {}

#: RGB mean and standard deviation (0-1 scale) of ImageNet, the input normalisation of the
#: official SReT models and of sret-train-vision
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: the same of CIFAR-10's training images, the input normalisation of the CIFAR-scale models
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def image_cfg(img_size: int = 224, **fields) -> dict:
    """A pretrained config in timm's format (the fields of ``timm.models.PretrainedCfg``): the
    input a model expects and how to prepare it. Evaluation resizes the shorter side to
    ``img_size / crop_pct`` (bicubic) and crops the centre: ``crop_pct`` 0.875 at 224 pixels
    and 1.0 above, as timm's DeiT configs; ImageNet normalisation."""
    cfg = dict(
        input_size=(3, img_size, img_size), crop_pct=0.875 if img_size <= 224 else 1.0, crop_mode="center",
        interpolation="bicubic", mean=IMAGENET_MEAN, std=IMAGENET_STD, num_classes=1000,
    )
    cfg.update(fields)
    return cfg


def register_model(
    fn: Callable[..., nn.Module] = None, *, name: Optional[str] = None, pretrained_cfg: Optional[dict] = None
):
    """Register a model constructor under ``name`` (default: the function name), with its
    pretrained config (:func:`image_cfg`; default: timm's defaults)."""

    def add(f):
        key = name or f.__name__
        if key in _MODELS and _MODELS[key] is not f:
            raise ValueError(f"a model named {key!r} is already registered")
        _MODELS[key] = f
        _PRETRAINED_CFGS[key] = dict(pretrained_cfg or {})
        return f

    return add(fn) if fn is not None else add


def get_pretrained_cfg(name: str) -> dict:
    """A copy of the pretrained config registered with model ``name``."""
    get_constructor(name)
    return dict(_PRETRAINED_CFGS[name], architecture=name)


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
