"""The paper's SReT models, registered by name (``create_model("sret_t")``, timm's
``timm.create_model("sret_t")``): one small function per model that only sets the
hyper-parameters of :class:`~fairseq_sret.vision.sret.model.SReT`, with its pretrained config.
Their parameter counts equal the official implementation's (szq0214/SReT), and
:func:`fairseq_sret.vision.load_checkpoint` loads official checkpoints.
"""

from typing import Optional

from ..registry import CIFAR10_MEAN, CIFAR10_STD, image_cfg, register_model
from .model import GLOBAL_GROUPS, SReT

# ----------------------------------------------------------------------------- models
# Hyper-parameters of the official SReT.py and the paper's appendix table. Each stage has
# (2, 5, 3) shared blocks applied twice: 20 layers; head width 32 (T, TL) or 42 (S).
#
# SReT-B exists only in the appendix table, which is inconsistent: its widths
# 336/672/1344 give 144.7M parameters, not the stated 71.2M. Keeping everything else from
# the table (stem 96-168-336, FFN 3.0, NLL 2.0, blocks 2/5/3) with a last stage of width
# 672 gives 70.8M (-0.5%), the one change of a single table entry we found that comes
# within 1%. The table gives no heads; we keep SReT-S's head width 42.
# embed_dims=(336, 672, 1344) builds the table as printed.
_SRET_T = dict(embed_dims=(64, 128, 256), num_heads=(2, 4, 8), mlp_ratio=3.6, nll_ratio=1.0)
_SRET_TL = dict(embed_dims=(64, 128, 256), num_heads=(2, 4, 8), mlp_ratio=4.0, nll_ratio=1.0)
_SRET_EXT = dict(_SRET_T, blocks=(1, 2, 3))  # derived, see sret_ext
_SRET_S = dict(embed_dims=(126, 252, 504), num_heads=(3, 6, 12), mlp_ratio=3.0, nll_ratio=2.0, drop_path_rate=0.2)
_SRET_B = dict(
    embed_dims=(336, 672, 672), num_heads=(8, 16, 16), mlp_ratio=3.0, nll_ratio=2.0,
    stem_dims=(96, 168, 336), drop_path_rate=0.2,
)


def _sret(arch: dict, **kwargs) -> SReT:
    return SReT(**{**arch, **kwargs})


def _cfg(img_size: int = 224, weights: Optional[str] = None) -> dict:
    """The pretrained config of an SReT model at ``img_size``. ``weights``: the official
    checkpoint of this architecture in the SReT repository's table (none bundled: load the
    file with ``pretrained=True, pretrained_cfg_overlay=dict(file=...)``)."""
    cfg = image_cfg(
        img_size, pool_size=(img_size // 32, img_size // 32), first_conv="stem.0.conv", classifier="head",
        fixed_input_size=False, license="mit", paper_name="Sliced Recursive Transformer",
        paper_ids="arXiv:2111.05297",
    )
    if weights:
        cfg.update(origin_url="https://github.com/szq0214/SReT",
                   notes=(f"official ImageNet-1k weights: {weights}",))
    return cfg


@register_model(pretrained_cfg=_cfg(weights="SReT_T"))
def sret_t(**kwargs) -> SReT:
    """SReT-T: 4.76M parameters, 1.11G MACs at 224x224."""
    return _sret(_SRET_T, **kwargs)


@register_model(pretrained_cfg=_cfg(weights="SReT_LT [8-4-1,2-1-1]"))
def sret_tl(**kwargs) -> SReT:
    """SReT-TL (official name SReT_LT): 4.99M parameters, 1.16G MACs."""
    return _sret(_SRET_TL, **kwargs)


@register_model(pretrained_cfg=_cfg(weights="SReT_S"))
def sret_s(**kwargs) -> SReT:
    """SReT-S: 20.9M parameters, 4.17G MACs."""
    return _sret(_SRET_S, **kwargs)


@register_model(pretrained_cfg=_cfg())
def sret_b(**kwargs) -> SReT:
    """SReT-B (appendix table, reconciled to its 71.2M parameters; see above): 70.8M."""
    return _sret(_SRET_B, **kwargs)


@register_model(pretrained_cfg=_cfg())
def sret_ext(**kwargs) -> SReT:
    """SReT-ExT, the paper's smallest model (4.0M parameters, 0.7G FLOPs, 74.0% top-1):
    3,938,017 parameters (-1.5%) and 0.688G MACs (-1.8%) at 224x224, as ``count_params`` /
    ``count_macs`` count them.

    The paper lists only those numbers; neither its appendix nor the official code gives
    the layout, so this one is derived. It is SReT-T with fewer shared blocks and nothing
    else changed: widths 64/128/256, heads 2/4/8 (head width 32), FFN ratio 3.6, NLL ratio
    1.0, stem, two recursions and groups [8,2][4,1][1,1] are SReT-T's; the shared blocks
    per stage go from (2, 5, 3) to (1, 2, 3).

    Why the blocks: from SReT-T (4.756M, 1.112G) the MACs must fall by 37% and the
    parameters only by 16%. A shared block (two applications, two NLLs) costs, at the
    three stages: stage 1 (28x28 tokens, width 64) 64K parameters and 134M MACs, stage 2
    (14x14, 128) 251K and 97M, stage 3 (7x7, 256) 1.0M and 87M. Three stage-2 blocks
    remove 754K parameters and 291M MACs (4.00M, 0.82G: the parameters are on target),
    and one stage-1 block the remaining MACs for few parameters (-134M, -64K). Keeping
    stage 3 keeps the final feature width and most parameters, where the FLOPs are cheap.
    The other knobs cut parameters and MACs at about the same rate, so they cannot reach
    both targets: an FFN ratio of 2.3 gives 4.01M parameters at 0.95G MACs, widths
    56/112/224 3.68M at 0.87G; more attention groups only cut the attention's 15% of the
    MACs.
    """
    return _sret(_SRET_EXT, **kwargs)


@register_model(pretrained_cfg=_cfg(weights="SReT_⋇T"))
def sret_t_wo_slice(**kwargs) -> SReT:
    """SReT-T without sliced attention (the paper's SReT-⋇T): 1.37G MACs."""
    return _sret(_SRET_T, groups=GLOBAL_GROUPS, **kwargs)


@register_model(pretrained_cfg=_cfg(weights="SReT_⋇LT"))
def sret_tl_wo_slice(**kwargs) -> SReT:
    """SReT-TL without sliced attention (SReT-⋇TL): 1.42G MACs."""
    return _sret(_SRET_TL, groups=GLOBAL_GROUPS, **kwargs)


@register_model(pretrained_cfg=_cfg(weights="SReT_⋇S"))
def sret_s_wo_slice(**kwargs) -> SReT:
    """SReT-S without sliced attention (SReT-⋇S)."""
    return _sret(_SRET_S, groups=GLOBAL_GROUPS, **kwargs)


@register_model(pretrained_cfg=_cfg())
def sret_b_wo_slice(**kwargs) -> SReT:
    """SReT-B without sliced attention."""
    return _sret(_SRET_B, groups=GLOBAL_GROUPS, **kwargs)


# Distilled (and fine-tuned) models have the architecture of their base model; the names
# identify checkpoints trained with soft distillation (``--teacher-*`` in
# sret-train-vision) and, with a resolution suffix, fine-tuned at that resolution.
_VARIANTS = {  # name: (base model, its settings, the official checkpoint or None)
    "sret_t_distill": (sret_t, {}, "SReT_T_Distill"),
    "sret_tl_distill": (sret_tl, {}, "SReT_LT_Distill"),
    "sret_s_distill": (sret_s, {}, None),
    "sret_b_distill": (sret_b, {}, None),
    "sret_t_wo_slice_distill": (sret_t_wo_slice, {}, "SReT_⋇T_Distill"),
    "sret_tl_wo_slice_distill": (sret_tl_wo_slice, {}, "SReT_⋇LT_Distill"),
    "sret_s_wo_slice_distill": (sret_s_wo_slice, {}, None),
    "sret_t_distill_384": (sret_t, {"img_size": 384}, None),
    "sret_tl_distill_384": (sret_tl, {"img_size": 384}, None),
    "sret_t_wo_slice_distill_384": (sret_t_wo_slice, {"img_size": 384}, "SReT_⋇T_Distill_Finetune384"),
    "sret_tl_wo_slice_distill_384": (sret_tl_wo_slice, {"img_size": 384}, None),
    "sret_s_wo_slice_distill_384": (sret_s_wo_slice, {"img_size": 384}, "SReT_⋇S_Distill_Finetune384"),
    "sret_s_wo_slice_distill_512": (sret_s_wo_slice, {"img_size": 512}, "SReT_⋇S_Distill_Finetune512"),
}


def _variant(name: str, base, defaults: dict, weights: Optional[str]):
    def constructor(**kwargs) -> SReT:
        return base(**{**defaults, **kwargs})

    constructor.__name__ = constructor.__qualname__ = name
    size = defaults.get("img_size")
    constructor.__doc__ = f"{base.__name__} trained with soft distillation" + (
        f", fine-tuned at {size}x{size}." if size else "."
    )
    return register_model(constructor, pretrained_cfg=_cfg(size or 224, weights))


for _name, (_base, _defaults, _weights) in _VARIANTS.items():
    globals()[_name] = _variant(_name, _base, _defaults, _weights)


# ----------------------------------------------------------------------------- CIFAR scale
# SReT-T's design at 32x32 pixels, sized so that one training run fits a few CPU-hours on one
# thread (docs/results/cifar10.md): the stem down-samples by 4, not 8, so the three stages see
# 8x8, 4x4 and 2x2 tokens; widths, heads, FFN and NLL ratios and groups are SReT-T's, with
# one, two and one shared blocks (8 layer applications). Each of the paper's ablation steps
# changes one field: ``recursions``, ``nll_ratio``, ``lrc``, ``groups``, ``stem``.
_SRET_CIFAR = dict(_SRET_T, blocks=(1, 2, 1), img_size=32, stem_stride=4, num_classes=10)
# The non-recursive baseline of the same family: plain pre-LN transformer blocks (no NLL, no
# LRC, global attention), each applied once, on the same stem and widths.
_CIFAR_BASELINE = dict(
    _SRET_CIFAR, recursions=1, nll_ratio=0.0, lrc=False, groups=((1,), (1,), (1,)), partition=("contiguous",)
)


def _cifar_cfg() -> dict:
    return image_cfg(
        32, crop_pct=1.0, pool_size=(2, 2), first_conv="stem.0.conv", classifier="head",
        mean=CIFAR10_MEAN, std=CIFAR10_STD, num_classes=10, fixed_input_size=False, license="mit",
    )


@register_model(pretrained_cfg=_cifar_cfg())
def sret_cifar(**kwargs) -> SReT:
    """SReT at CIFAR scale (32x32, 10 classes): SReT-T's stages with (1, 2, 1) shared blocks
    applied twice, a stride-4 conv stem, NLL, LRC and sliced groups; 1.64M parameters."""
    return _sret(_SRET_CIFAR, **kwargs)


@register_model(pretrained_cfg=_cifar_cfg())
def sret_cifar_wo_slice(**kwargs) -> SReT:
    """:func:`sret_cifar` with global attention in every application."""
    return _sret(_SRET_CIFAR, groups=GLOBAL_GROUPS, **kwargs)


@register_model(pretrained_cfg=_cifar_cfg())
def sret_cifar_baseline(**kwargs) -> SReT:
    """The non-recursive baseline with SReT-CIFAR's unique blocks: (1, 2, 1) plain transformer
    blocks applied once (no NLL, no LRC, global attention), the same stem and widths; the same
    model as ``sret_cifar(recursions=1, nll_ratio=0, lrc=False, groups=((1,), (1,), (1,)),
    partition=("contiguous",))``."""
    return _sret(_CIFAR_BASELINE, **kwargs)


@register_model(pretrained_cfg=_cifar_cfg())
def sret_cifar_baseline_deep(**kwargs) -> SReT:
    """The non-recursive baseline with SReT-CIFAR's layer applications: (2, 4, 2) unique
    plain blocks, so the same compute per image as :func:`sret_cifar_wo_slice` without NLLs."""
    return _sret(_CIFAR_BASELINE, blocks=(2, 4, 2), **kwargs)


#: the registered models (``from fairseq_sret.vision.sret import sret_t`` keeps working)
__all__ = [
    "sret_t", "sret_tl", "sret_s", "sret_b", "sret_ext", "sret_t_wo_slice", "sret_tl_wo_slice", "sret_s_wo_slice",
    "sret_b_wo_slice", *_VARIANTS, "sret_cifar", "sret_cifar_wo_slice", "sret_cifar_baseline",
    "sret_cifar_baseline_deep",
]
