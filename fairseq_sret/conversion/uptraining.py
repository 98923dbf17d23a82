"""Uptraining: a trained fairseq ``transformer`` checkpoint -> an ``sret_transformer`` checkpoint
with fewer unique layers, to be fine-tuned (``fairseq-train --finetune-from-model``).

**Layer mapping.** SReT applies each unique layer R times in a row (3 unique x 2 recursions
runs S0 S0 S1 S1 S2 S2), so unique layer i runs where the original layers i*R .. i*R+R-1 ran,
and it starts from their parameter-wise **average** - the initialisation Relaxed Recursive
Transformers (Bae et al., 2024) found best for uptraining (their recursion is cyclic, S0 S1
S2 S0 S1 S2, where the same rule averages layers i, i+K, ...; ours is SReT's consecutive
order). In general, original layer j of L goes to unique layer ``floor(j * U / L)``:
contiguous groups in depth order, sizes differing by at most one (6 -> 4: {0,1} {2} {3,4} {5}).
Layer norms are averaged like every other layer parameter.

**Identity additions.** Every NLL starts as the identity: its MLP's output layer (``fc2``)
is zero, so ``NLL(z) = theta * z + zeta * 0 = z`` with LRC and ``z + 0`` without (the branch
then learns from the first update, as a zero-initialised residual branch does). Every LRC
coefficient starts at 1, so the residuals are the original ones. Embeddings, positions, the
final layer norms and the output projection are copied. Hence with one recursion and as
many unique layers as the original, the converted model computes exactly what the original
computes, NLL and LRC included (tested).

**Configuration.** The checkpoint's model configuration (``args``, or ``cfg.model`` as a
command-line run or fairseq-hydra-train wrote it) becomes an ``sret_transformer`` namespace
with the original's widths, heads, dropout, LN placement and embedding sharing, the new
layer counts and the SReT options, checked by ``check_sret_options``.
:func:`finetune_options` gives the ``fairseq-train`` options that build the same model.
"""

import argparse
import copy
import re
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..extras import require

require("fairseq", "uptraining (fairseq_sret.conversion.uptraining)")

from fairseq.data import Dictionary, data_utils  # noqa: E402
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY  # noqa: E402
from fairseq.models.transformer import DEFAULT_MAX_SOURCE_POSITIONS, DEFAULT_MAX_TARGET_POSITIONS  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402  (fairseq's)

from ..models.sret_transformer import SReTTransformerModel, check_sret_options
from ..models.sret_transformer.dictionaries import DICTIONARY_FINGERPRINTS, dictionary_fingerprint
from ..models.sret_transformer.hydra_config import _flag, _options
from .convert import fairseq_transformer_to_sret

SIDES = ("encoder", "decoder")
_SRET_LAYER = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.recursive\.(layer|nlls)\.(.+)$")
_NLL_OUTPUT = re.compile(r"^\d+\.mlp\.fc2\.(weight|bias)$")
_LRC = ("skip_scale", "branch_scale")


def layer_groups(num_layers: int, unique: int) -> List[List[int]]:
    """The original layers each unique layer replaces: layer j -> unique layer j * U // L."""
    if not 1 <= unique <= num_layers:
        raise ValueError(f"unique layers must be between 1 and the original {num_layers}, got {unique}")
    groups: List[List[int]] = [[] for _ in range(unique)]
    for j in range(num_layers):
        groups[j * unique // num_layers].append(j)
    return groups


def source_model_args(state: dict) -> argparse.Namespace:
    """The model configuration of a fairseq ``transformer`` checkpoint (architecture defaults
    filled in), from ``args`` or ``cfg.model``, whichever the checkpoint holds."""
    args = state.get("args")
    if args is None:
        cfg = state.get("cfg")
        args = (cfg.get("model") if hasattr(cfg, "get") else getattr(cfg, "model", None)) if cfg is not None else None
    if args is None:
        raise ValueError("the checkpoint holds no model configuration (neither 'args' nor 'cfg.model')")
    if isinstance(args, argparse.Namespace):
        args = copy.deepcopy(args)
    else:
        args = argparse.Namespace(**(OmegaConf.to_container(args, resolve=True) if OmegaConf.is_config(args) else dict(args)))
    arch = getattr(args, "arch", None) or getattr(args, "_name", None)
    if ARCH_MODEL_NAME_REGISTRY.get(arch) != "transformer":
        raise ValueError(
            f"the checkpoint is a {arch!r} model; uptraining converts fairseq 'transformer' checkpoints"
            f" (--arch transformer, transformer_iwslt_de_en, transformer_wmt_en_de, ...)"
        )
    args.arch = arch
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def sret_args(
    source: argparse.Namespace,
    encoder_layers: Optional[int] = None,
    decoder_layers: Optional[int] = None,
    encoder_recursions: int = 2,
    decoder_recursions: int = 2,
    encoder_groups: str = "1",
    decoder_groups: str = "1",
    nll_ratio: float = 1.0,
    lrc: bool = True,
) -> argparse.Namespace:
    """The ``sret_transformer`` namespace for the uptrained model of ``source`` (a transformer
    namespace): its widths, heads, dropout, LN placement and sharing; ``{side}_layers`` unique
    layers (default: the original count / recursions) applied ``{side}_recursions`` times."""
    args = copy.deepcopy(source)
    layers = {"encoder": encoder_layers, "decoder": decoder_layers}
    recursions = {"encoder": encoder_recursions, "decoder": decoder_recursions}
    for side in SIDES:
        original = getattr(source, f"{side}_layers")
        if getattr(source, f"{side}_layers_to_keep", None):
            raise ValueError(f"the checkpoint was trained with --{side}-layers-to-keep (pruned LayerDrop); uptrain the unpruned one")
        if layers[side] is None:
            if original % recursions[side]:
                raise ValueError(
                    f"{original} {side} layers do not divide into {recursions[side]} recursions:"
                    f" give --{side}-layers (the unique layers)"
                )
            layers[side] = original // recursions[side]
        layer_groups(original, layers[side])  # checks the count
        setattr(args, f"{side}_layers", layers[side])
        setattr(args, f"{side}_recursions", recursions[side])
        setattr(args, f"{side}_groups", {"encoder": encoder_groups, "decoder": decoder_groups}[side])
        setattr(args, f"{side}_partition", "auto")
        # training-time features of the original that sret_transformer does not have
        setattr(args, f"{side}_layerdrop", 0)
    args.arch = args._name = "sret_transformer"
    args.nll_ratio = nll_ratio
    args.no_lrc = not lrc
    # the original's LN placement: --post-ln for fairseq's post-LN (no final layer norms),
    # else --{side}-normalize-before per side
    args.post_ln = not (source.encoder_normalize_before or source.decoder_normalize_before)
    args.checkpoint_recursions = False
    args.checkpoint_activations = args.offload_activations = False
    ARCH_CONFIG_REGISTRY["sret_transformer"](args)
    check_sret_options(args)
    return args


def _dictionary_of_size(size: int) -> Dictionary:
    """A fairseq dictionary of ``size`` entries: the special symbols, then placeholders."""
    dictionary = Dictionary()
    while len(dictionary) < size:
        dictionary.add_symbol(f"<unused{len(dictionary)}>")
    return dictionary


class _Task:
    """The dictionaries' sizes are all build_model needs of a task."""

    def __init__(self, source_size: int, target_size: int):
        self.source_dictionary = _dictionary_of_size(source_size)
        self.target_dictionary = (
            self.source_dictionary if target_size == source_size else _dictionary_of_size(target_size)
        )


def build_sret(args: argparse.Namespace, source_size: int, target_size: int) -> SReTTransformerModel:
    return ARCH_MODEL_REGISTRY["sret_transformer"].build_model(copy.deepcopy(args), _Task(source_size, target_size))


def uptrain_state_dict(
    source_sd: Dict[str, Tensor], source: argparse.Namespace, target: argparse.Namespace, seed: int = 1
) -> Tuple[Dict[str, Tensor], Dict[str, List[List[int]]]]:
    """The ``sret_transformer`` parameters for ``target`` from a transformer's ``source_sd``:
    averaged layers, identity NLLs (fc2 = 0, the rest initialised as usual with ``seed``), LRC
    coefficients 1, everything else copied. Returns (state dict, layer groups per side)."""
    groups = {side: layer_groups(getattr(source, f"{side}_layers"), getattr(target, f"{side}_layers")) for side in SIDES}
    per_layer = fairseq_transformer_to_sret(source_sd)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build_sret(target, source_sd["encoder.embed_tokens.weight"].shape[0],
                           source_sd["decoder.embed_tokens.weight"].shape[0])
    fresh = model.state_dict()
    out: Dict[str, Tensor] = {}
    used = set()
    for name, init in fresh.items():
        match = _SRET_LAYER.match(name)
        if match is None:
            if name not in per_layer:
                raise KeyError(f"the checkpoint has no {name!r}, which the sret_transformer needs")
            value = per_layer[name]
            used.add(name)
        else:
            side, index, part, rest = match.groups()
            if part == "nlls":
                value = torch.zeros_like(init) if _NLL_OUTPUT.match(rest) else init
            elif rest.endswith(_LRC):
                value = init  # ones
            else:
                names = [f"{side}.layers.{j}.recursive.layer.{rest}" for j in groups[side][int(index)]]
                missing = [n for n in names if n not in per_layer]
                if missing:
                    raise KeyError(f"the checkpoint has no {missing[0]!r} (converted name)")
                used.update(names)
                for j, n in zip(groups[side][int(index)], names):
                    if per_layer[n].shape != init.shape:
                        raise ValueError(
                            f"{side} layer {j}, {rest}: the checkpoint's shape {tuple(per_layer[n].shape)} != "
                            f"{tuple(init.shape)}, which its configuration gives (a damaged or edited checkpoint)")
                stacked = torch.stack([per_layer[n].float() for n in names])
                value = stacked.mean(0).to(per_layer[names[0]].dtype)
        if value.shape != init.shape:
            raise ValueError(f"{name}: the checkpoint's shape {tuple(value.shape)} != the model's {tuple(init.shape)}")
        out[name] = value  # the checkpoint's own tensors where copied: tied embeddings stay tied
    unused = sorted(set(per_layer) - used)
    if unused:
        raise KeyError(f"parameters of the checkpoint with no place in sret_transformer: {unused[:5]}")
    return out, groups


def finetune_options(args: argparse.Namespace) -> List[str]:
    """``fairseq-train`` model options that build ``args``'s model: ``--arch sret_transformer``
    and every model option whose value differs from that architecture's default. A ValueError
    says when a value cannot be given on the command line (one side pre-LN, the other post-LN)."""
    defaults = argparse.Namespace(post_ln=args.post_ln)
    ARCH_CONFIG_REGISTRY["sret_transformer"](defaults)
    options = ["--arch", "sret_transformer"]
    for key, action in _options(SReTTransformerModel).items():
        value = getattr(args, key, None)
        default = False if key == "post_ln" else getattr(defaults, key, action.default)  # defaults given it
        if key in ("max_source_positions", "max_target_positions"):
            default = DEFAULT_MAX_SOURCE_POSITIONS if key == "max_source_positions" else DEFAULT_MAX_TARGET_POSITIONS
        if value is None or value == default:
            continue
        if key == "share_decoder_input_output_embed" and args.share_all_embeddings:
            continue  # implied
        if key == "decoder_output_dim" and value == args.decoder_embed_dim:
            continue  # derived (and typeless on the command line)
        if isinstance(action, argparse._StoreTrueAction):
            if value:
                options.append(_flag(action))
            else:
                raise ValueError(
                    f"{key}=false cannot be given on the command line, where sret_transformer's"
                    f" default is true: fine-tune with fairseq-hydra-train and model.{key}: false"
                )
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        options += [_flag(action), str(value)]
    return options


def data_bin_fingerprints(data: str, state: dict) -> Dict[str, str]:
    """The fingerprints of the dictionaries of the data-bin ``data`` (fairseq's first path of a
    colon-separated list) for the language pair of the transformer checkpoint ``state`` (its
    options, else the data-bin's file names); ValueError when a dictionary is missing or its
    size is not the checkpoint's embedding rows."""
    folder = Path(data.split(":")[0])
    options = state.get("args") or {}
    if not options and state.get("cfg") is not None:
        cfg = state["cfg"]
        options = cfg.get("task") if hasattr(cfg, "get") else getattr(cfg, "task", None)
    pair = [getattr(options, name, None) if not hasattr(options, "get") else options.get(name)
            for name in ("source_lang", "target_lang")]
    if None in pair and folder.is_dir():
        pair = list(data_utils.infer_language_pair(str(folder)))
    if None in pair:
        raise ValueError(f"{folder}: the checkpoint's options name no language pair and the folder has no"
                         " binarized split (SPLIT.SRC-TGT.LANG.idx) to read it from")
    fingerprints = {}
    for side, lang, embeddings in zip(("source", "target"), pair, ("encoder", "decoder")):
        path = folder / f"dict.{lang}.txt"
        if not path.is_file():
            raise ValueError(f"{folder}: no {side} dictionary {path.name} (the checkpoint's pair is"
                             f" {pair[0]}-{pair[1]})")
        dictionary = Dictionary.load(str(path))
        rows = state["model"][f"{embeddings}.embed_tokens.weight"].size(0)
        if len(dictionary) != rows:
            raise ValueError(f"{path}: {len(dictionary)} symbols, but the checkpoint's {embeddings} embeddings have"
                             f" {rows} rows: not the data-bin the transformer was trained on")
        fingerprints[f"{side}_dictionary_fingerprint"] = dictionary_fingerprint(dictionary)
    return fingerprints


def uptrain_checkpoint(state: dict, seed: int = 1, fingerprints: Optional[Dict[str, str]] = None,
                       **options) -> Tuple[dict, dict]:
    """The ``sret_transformer`` checkpoint (a dict like fairseq's) for a transformer checkpoint
    ``state``; ``options`` are :func:`sret_args`'s. Returns (checkpoint, report) where the report
    holds the layer groups, parameter counts and :func:`finetune_options`.

    ``fingerprints`` (``{source,target}_dictionary_fingerprint``: the dictionaries the
    transformer was trained with) go where a trained SReT model keeps them, beside its weights,
    so that generating with, or fine-tuning from, the checkpoint on another dictionary is
    refused (:func:`~fairseq_sret.models.sret_transformer.dictionaries.check_dictionaries`)."""
    source = source_model_args(state)
    target = sret_args(source, **options)
    model_sd, groups = uptrain_state_dict(state["model"], source, target, seed=seed)
    if fingerprints:
        unknown = set(fingerprints) - set(DICTIONARY_FINGERPRINTS)
        if unknown:
            raise ValueError(f"unknown fingerprints {sorted(unknown)}; expected {DICTIONARY_FINGERPRINTS}")
        model_sd = OrderedDict(model_sd)
        model_sd._metadata = OrderedDict({"": dict(fingerprints)})  # read by the model's _load_from_state_dict
    out = {k: v for k, v in state.items() if k not in ("model", "last_optimizer_state")}
    out["model"] = model_sd
    if state.get("args") is not None:
        out["args"] = target
    else:
        cfg = state["cfg"]
        cfg = dict(OmegaConf.to_container(cfg) if OmegaConf.is_config(cfg) else cfg)
        if isinstance(cfg.get("model"), argparse.Namespace):  # a command-line run: one flat namespace
            out["cfg"] = dict(cfg, model=target)
        else:  # fairseq-hydra-train's model section: its keys only
            out["cfg"] = dict(cfg, model={k: v for k, v in vars(target).items() if k != "arch"})
    try:
        options, note = finetune_options(target), None
    except ValueError as exc:
        options, note = None, str(exc)
    report = {
        "source_arch": source.arch,
        "groups": groups,
        "recursions": {side: getattr(target, f"{side}_recursions") for side in SIDES},
        "source_params": _count(state["model"]),
        "params": _count(model_sd),  # tied embeddings once
        "finetune_options": options,
        "note": note,
    }
    out["extra_state"] = dict(out.get("extra_state") or {}, sret_uptrain={k: v for k, v in report.items()})
    return out, report


def _count(sd: Dict[str, Tensor]) -> int:
    """Parameters, each tensor once (tied embeddings appear under several names)."""
    seen = {}
    for name, t in sd.items():
        if name.endswith((".version", "._float_tensor")):
            continue  # buffers
        seen.setdefault((t.data_ptr(), tuple(t.shape)), t.numel())
    return sum(seen.values())
