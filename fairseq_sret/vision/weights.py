"""Weights of the vision models: official SReT checkpoints (szq0214/SReT) and our own.

The official code stores ``{'model': state_dict}``. Its stage ``s`` is a flat list
``transformers.s.blocks.i``: for shared block ``b`` and recursion ``r`` (``R`` recursions),
entry ``i = 2 * (b * R + r)`` is the shared block (listed once per application, so its
weights appear ``R`` times) and ``i + 1`` is the NLL of that application. The LRC
coefficients are called ``coefficientK.bias``:

==========================  ===========================================
official                    ours
==========================  ===========================================
patch_embed.convK / bnK     stem.{K-1}.conv / stem.{K-1}.norm
block norm1, attn.qkv       layer.self_attn_norm, layer.self_attn.qkv
block attn.proj             layer.self_attn.out_proj
block norm2, mlp.fcK        layer.ffn_norm, layer.ffn.fcK
block coefficient1 / 2      layer.self_attn_residual.skip_scale / branch_scale
block coefficient3 / 4      layer.ffn_residual.skip_scale / branch_scale
NLL norm1, mlp.fcK          nlls.r.norm, nlls.r.mlp.fcK
NLL coefficient1 / 2        nlls.r.residual.skip_scale / branch_scale
pools.k.conv                pools.k.conv
pos_embed, norm, head       the same
==========================  ===========================================

(block = ``stages.s.blocks.b.layer``; NLL = ``stages.s.blocks.b.nlls.r``.)
"""

import re
import warnings
from typing import Dict, Mapping, Optional, Union

import torch
from torch import Tensor, nn

from ..checkpoints import load_checkpoint as read_safely
from ..checkpoints import mismatch_summary
from ..checkpoints import save_checkpoint as write_atomically
from .cct import CCT
from .sret import SReT, resize_pos_embed

_BLOCK_NAMES = {
    "norm1": "self_attn_norm",
    "attn.qkv": "self_attn.qkv",
    "attn.proj": "self_attn.out_proj",
    "norm2": "ffn_norm",
    "mlp.fc1": "ffn.fc1",
    "mlp.fc2": "ffn.fc2",
    "coefficient1.bias": "self_attn_residual.skip_scale",
    "coefficient2.bias": "self_attn_residual.branch_scale",
    "coefficient3.bias": "ffn_residual.skip_scale",
    "coefficient4.bias": "ffn_residual.branch_scale",
}
_NLL_NAMES = {
    "norm1": "norm",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
    "coefficient1.bias": "residual.skip_scale",
    "coefficient2.bias": "residual.branch_scale",
}
_STEM = re.compile(r"patch_embed\.(conv|bn)(\d)\.(.+)")
_BLOCK = re.compile(r"transformers\.(\d+)\.blocks\.(\d+)\.(.+)")


def _rename(sub: str, names: Mapping[str, str], key: str) -> str:
    for official, ours in names.items():
        if sub == official:
            return ours
        if sub.startswith(official + "."):
            return ours + sub[len(official):]
    raise KeyError(f"unexpected official key {key!r}")


def is_official_state_dict(state_dict: Mapping[str, Tensor]) -> bool:
    return any(k.startswith("transformers.") or k.startswith("patch_embed.") for k in state_dict)


def convert_official_state_dict(
    state_dict: Mapping[str, Tensor], model: SReT, check_shared: bool = True
) -> Dict[str, Tensor]:
    """Rename an official SReT state dict to ``model``'s names.

    ``model`` supplies the number of shared blocks per stage and of recursions, which
    the official flat block list does not record. The copies of each shared block must
    be identical (``check_shared``); a missing or unexpected key raises.
    """
    cfg = model.cfg
    recursions = cfg.recursions
    out: Dict[str, Tensor] = {}
    for key, value in state_dict.items():
        match = _STEM.fullmatch(key)
        if match:
            kind, k, rest = match.groups()
            out[f"stem.{int(k) - 1}.{'conv' if kind == 'conv' else 'norm'}.{rest}"] = value
            continue
        match = _BLOCK.fullmatch(key)
        if not match:
            if key in ("pos_embed",) or key.split(".")[0] in ("norm", "head", "pools"):
                out[key] = value
                continue
            raise KeyError(f"unexpected official key {key!r}")
        stage, index, sub = int(match.group(1)), int(match.group(2)), match.group(3)
        if stage >= len(cfg.blocks):
            raise KeyError(f"{key!r}: the model has {len(cfg.blocks)} stages")
        application, is_nll = divmod(index, 2)
        block, recursion = divmod(application, recursions)
        if block >= cfg.blocks[stage]:
            raise KeyError(
                f"{key!r}: stage {stage} of the model has {cfg.blocks[stage]} shared blocks x"
                f" {recursions} recursions = {2 * cfg.blocks[stage] * recursions} official entries"
            )
        prefix = f"stages.{stage}.blocks.{block}"
        if is_nll:
            new = f"{prefix}.nlls.{recursion}.{_rename(sub, _NLL_NAMES, key)}"
        else:
            new = f"{prefix}.layer.{_rename(sub, _BLOCK_NAMES, key)}"
        if new in out:
            if out[new].shape != value.shape or (check_shared and not torch.equal(out[new], value)):
                raise ValueError(
                    f"{key!r} is an application of shared block {prefix} but differs from its"
                    " first application: not an SReT checkpoint with this recursion layout"
                )
            continue
        out[new] = value
    return out


def _unwrap(checkpoint) -> Dict[str, Tensor]:
    if isinstance(checkpoint, Mapping):
        for key in ("model", "state_dict", "model_ema"):
            if key in checkpoint and isinstance(checkpoint[key], Mapping):
                checkpoint = checkpoint[key]
                break
    if not isinstance(checkpoint, Mapping):
        raise TypeError("a checkpoint must be a state dict or a dict holding one under 'model'")
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in checkpoint.items()}


def checkpoint_filter_fn(checkpoint: Mapping, model: nn.Module) -> Dict[str, Tensor]:
    """A checkpoint's state dict in ``model``'s names and shapes: unwrapped (see
    :func:`load_checkpoint`), an official SReT one renamed (:func:`convert_official_state_dict`:
    one copy of each shared block, LRC names), the position embedding interpolated to the
    model's resolution. timm's ``pretrained_filter_fn`` of the models (``timm.create_model(name,
    pretrained=True, pretrained_cfg_overlay=dict(file=...))``) and the first step of
    :func:`load_checkpoint`."""
    state_dict = _unwrap(checkpoint)
    if isinstance(model, SReT) and is_official_state_dict(state_dict):
        state_dict = convert_official_state_dict(state_dict, model)
    own = model.state_dict()
    if "pos_embed" in state_dict and "pos_embed" in own and isinstance(model, (SReT, CCT)):
        pos = state_dict["pos_embed"]
        if pos.shape != own["pos_embed"].shape and pos.shape[:2] == own["pos_embed"].shape[:2]:
            state_dict["pos_embed"] = resize_pos_embed(pos.float(), tuple(own["pos_embed"].shape[-2:])).to(pos.dtype)
    return state_dict


def load_checkpoint(
    model: nn.Module, checkpoint: Union[str, Mapping], strict: bool = True, map_location="cpu"
) -> nn.Module:
    """Load weights (a path or a loaded dict) into ``model``, official format or ours.

    Accepts ``{'model': state_dict}`` (official SReT and sret-train-vision),
    ``{'state_dict': ...}`` or a bare state dict; strips a DDP ``module.`` prefix.
    Official SReT checkpoints are renamed with :func:`convert_official_state_dict`. A
    position embedding made at another resolution is interpolated (bicubic) to the
    model's. With ``strict=False`` (fine-tuning) tensors whose shape differs, such as a
    classifier for another number of classes, are skipped with a warning; a checkpoint none
    of whose tensors fits (another kind of model) is a ValueError.
    """
    if isinstance(checkpoint, (str, bytes)) or hasattr(checkpoint, "__fspath__"):
        # weights_only, with errors that name the file (damaged, not a checkpoint, unsafe)
        checkpoint = read_safely(checkpoint)  # on the CPU; load_state_dict copies to the model's device
    state_dict = checkpoint_filter_fn(checkpoint, model)
    own = model.state_dict()
    if not strict:
        skipped = [k for k, v in state_dict.items() if k in own and own[k].shape != v.shape]
        state_dict = {k: v for k, v in state_dict.items() if k not in skipped}
        if not any(k in own for k in state_dict):  # another kind of model: nothing would load
            raise ValueError(f"the checkpoint holds none of this {type(model).__name__}'s weights (its keys, e.g."
                             f" {next(iter(state_dict), 'none')!r}, name none of the model's): a checkpoint of"
                             " another kind of model?")
        result = model.load_state_dict(state_dict, strict=False)
        if skipped or result.missing_keys or result.unexpected_keys:
            warnings.warn(
                f"partial checkpoint load: skipped (shape) {skipped}, missing {result.missing_keys},"
                f" unexpected {result.unexpected_keys}"
            )
        return model
    mismatch = _mismatch(state_dict, own)
    if mismatch:
        raise ValueError(f"the checkpoint's weights do not fit this {type(model).__name__}: {mismatch} (a checkpoint"
                         " of another model, size or number of classes?)")
    model.load_state_dict(state_dict)
    return model


def _mismatch(saved: Mapping[str, Tensor], own: Mapping[str, Tensor]) -> str:
    """What keeps ``saved`` from loading strictly into ``own``, in one line ("" if nothing)."""
    shapes = [(k, list(saved[k].shape), list(own[k].shape)) for k in saved
              if k in own and tuple(getattr(saved[k], "shape", ())) != tuple(own[k].shape)]
    return mismatch_summary([k for k in own if k not in saved], [k for k in saved if k not in own], shapes)


def save_checkpoint(model: nn.Module, path, extra: Optional[dict] = None) -> None:
    """Save ``{'model': state_dict, **extra}`` (the layout :func:`load_checkpoint` reads),
    replacing ``path`` atomically (:func:`fairseq_sret.checkpoints.save_checkpoint`)."""
    write_atomically({"model": model.state_dict(), **(extra or {})}, path)
