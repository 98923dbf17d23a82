"""SReT image models in pure PyTorch (no fairseq import).

    from fairseq_sret.vision import create_model, list_models, load_checkpoint
    model = create_model("sret_t")                       # SReT-T, 4.76M params, 1.11G MACs
    load_checkpoint(model, "SReT_T.pth")                 # official or our checkpoints

Importing this package registers the models with timm when timm is installed: after
``import fairseq_sret.vision`` they are timm models (``timm.create_model("sret_t")``, pretrained
configs, ``features_only=True``, timm's scripts; docs/vision.md).
"""

from . import cct, legacy, mixer, sret  # noqa: F401  (register the models)
from .cct import CCT, CCTConfig
from .complexity import count_macs, count_params
from .export import check_onnx, export_onnx
from .factory import create_model, register_with_timm
from .losses import SoftDistillationLoss, soft_distillation_loss
from .mixer import MixerConfig, RecursiveMixer
from .registry import is_model, list_models, register_model
from .sret import GLOBAL_GROUPS, SLICED_GROUPS, SReT, SReTVisionConfig, resize_pos_embed
from .weights import checkpoint_filter_fn, convert_official_state_dict, load_checkpoint, save_checkpoint

register_with_timm()


def __getattr__(name: str):
    if name == "SReTConfig":  # the old name: one class name per meaning
        legacy.deprecated(legacy.SRET_CONFIG_RENAMED, stacklevel=3)
        return SReTVisionConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "CCT",
    "CCTConfig",
    "GLOBAL_GROUPS",
    "MixerConfig",
    "RecursiveMixer",
    "SLICED_GROUPS",
    "SReT",
    "SReTVisionConfig",
    "SoftDistillationLoss",
    "check_onnx",
    "checkpoint_filter_fn",
    "convert_official_state_dict",
    "count_macs",
    "count_params",
    "create_model",
    "export_onnx",
    "is_model",
    "list_models",
    "load_checkpoint",
    "register_model",
    "register_with_timm",
    "resize_pos_embed",
    "save_checkpoint",
    "soft_distillation_loss",
]
