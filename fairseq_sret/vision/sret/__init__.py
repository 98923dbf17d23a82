"""SReT image classifiers (paper Sec. 3-4, Appendix "Details of Our SReT Architectures").

- :mod:`.layers`: the stems, the depth-wise conv pooling between stages and the recursive
  stage, whose shared blocks come from :mod:`fairseq_sret.core` (the same modules as the
  translation models);
- :mod:`.model`: :class:`SReTVisionConfig` and the classifier :class:`SReT`;
- :mod:`.constructors`: the paper's models, registered by name (``create_model("sret_t")``).

Everything here is importable from ``fairseq_sret.vision.sret`` as before the split.
"""

from ..legacy import SRET_CONFIG_RENAMED, deprecated
from ..registry import CIFAR10_MEAN, CIFAR10_STD
from . import constructors
from .constructors import *  # noqa: F401,F403  (the registered models)
from .layers import ConvBNReLU, ConvPooling, ConvStem, PatchStem, RecursiveStage, resize_pos_embed
from .layers import _add_pos_embed, _pair, _prepare_input, _tokens_to_map  # noqa: F401  (the old import path)
from .model import GLOBAL_GROUPS, PARTITION, SLICED_GROUPS, SReT, SReTVisionConfig

__all__ = [
    "CIFAR10_MEAN", "CIFAR10_STD", "ConvBNReLU", "ConvPooling", "ConvStem", "GLOBAL_GROUPS", "PARTITION", "PatchStem",
    "RecursiveStage", "SLICED_GROUPS", "SReT", "SReTVisionConfig", "resize_pos_embed", *constructors.__all__,
]


def __getattr__(name: str):
    if name == "SReTConfig":  # the old name: one class name per meaning
        deprecated(SRET_CONFIG_RENAMED, stacklevel=3)
        return SReTVisionConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
