"""sret_transformer's options, their defaults and their checks.

:class:`SReTOptions` are the SReT-specific options (everything else is fairseq's transformer
config); :func:`sret_base_architecture` fills the defaults; :func:`check_sret_options` fails
at model build, naming the option, for every invalid configuration; :func:`recursion_schedule`
reads a side's recursion schedule from the options.
"""

import hashlib
import logging
import math
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import FairseqDataclass
from fairseq.models.transformer import base_architecture

from ...core import RecursionSchedule, Recursive, get_activation
from ...core.mixed_depth import untrained_depth_warning
from ...core.partition import PARTITION_MODES

logger = logging.getLogger(__name__)


@dataclass
class SReTOptions(FairseqDataclass):
    """The SReT-specific options (everything else is fairseq's transformer config)."""

    encoder_recursions: int = field(
        default=2, metadata={"help": "applications of each (weight-shared) encoder layer"}
    )
    decoder_recursions: int = field(
        default=2, metadata={"help": "applications of each (weight-shared) decoder layer"}
    )
    encoder_groups: str = field(
        default="1", metadata={"help": "encoder self-attention groups per recursion, e.g. '2,1'"
                               " (one value applies to every recursion)"}
    )
    decoder_groups: str = field(
        default="1", metadata={"help": "decoder self-attention groups per recursion, e.g. '2,1'"}
    )
    encoder_partition: str = field(
        default="auto",
        metadata={"help": f"encoder partition mode per recursion ({', '.join(PARTITION_MODES)});"
                  " 'auto' = contiguous for the first recursion, random for the later ones"
                  " (the official SReT scheme)"},
    )
    decoder_partition: str = field(
        default="auto",
        metadata={"help": "decoder partition mode per recursion (strided or random: causal"
                  " decoding cannot use contiguous slices); 'auto' = strided, then random"},
    )
    nll_ratio: float = field(
        default=1.0, metadata={"help": "hidden ratio of the NLL between recursions (0 = no NLL)"}
    )
    no_lrc: bool = field(
        default=False, metadata={"help": "plain residual connections instead of LRC"}
    )
    post_ln: bool = field(
        default=False, metadata={"help": "post-LN layers (fairseq's transformer default) instead"
                                 " of the pre-LN layers of the paper; overrides"
                                 " --encoder/decoder-normalize-before"}
    )
    checkpoint_recursions: bool = field(
        default=False, metadata={"help": "activation checkpointing of every layer application:"
                                 " memory grows with unique layers, not total depth"}
    )
    encoder_trained_recursions: Optional[int] = field(
        default=None, metadata={"help": "recorded at the first build (= --encoder-recursions) and kept"
                                " in checkpoints: the encoder layers are built with this many"
                                " recursions and run --encoder-recursions of them, so a checkpoint"
                                " runs shallower with --model-overrides \"{'encoder_recursions': 1}\""}
    )
    decoder_trained_recursions: Optional[int] = field(
        default=None, metadata={"help": "recorded at the first build (= --decoder-recursions); see"
                                " --encoder-trained-recursions"}
    )


def recursion_schedule(args, side: str) -> RecursionSchedule:
    """The recursion schedule of ``side``'s layers from the command-line options.

    Errors name the options (``--encoder-groups``, ...). ``auto`` partitions resolve to
    contiguous-then-random (encoder) and strided-then-random (decoder, causal).

    Depth on demand: the layers are built with ``{side}_trained_recursions`` applications
    (recorded at the first build, so kept in checkpoints) and run the first
    ``--{side}-recursions`` of them. A checkpoint loaded with ``--model-overrides
    "{'encoder_recursions': 1}"`` thus keeps every NLL it was trained with (and loads
    strictly) and runs one application per layer; the group and partition settings are
    those of the trained schedule.
    """
    recursions = getattr(args, f"{side}_recursions")
    trained = getattr(args, f"{side}_trained_recursions", None)
    built = recursions if trained is None else trained
    names = {name: f"--{side}-{name}" for name in ("recursions", "groups", "partition")}
    if trained is not None and trained != recursions:
        names["recursions"] = f"{side}_trained_recursions"
    groups, partition = getattr(args, f"{side}_groups"), getattr(args, f"{side}_partition")
    try:
        schedule = RecursionSchedule.parse(
            built, groups=groups, partition=partition, causal=side == "decoder", names=names
        )
    except ValueError as exc:
        listed = max(_listed(groups), _listed(partition))
        if built == recursions and isinstance(built, int) and 1 < listed and built < listed:
            raise ValueError(
                f"{exc}. (Loading a checkpoint saved without {side}_trained_recursions at a smaller"
                f" depth? Give the trained count too: --model-overrides \"{{'{side}_recursions':"
                f" {recursions}, '{side}_trained_recursions': {listed}}}\")"
            ) from None
        raise
    return schedule.with_depth(
        recursions, name=f"--{side}-recursions",
        built=f"this model was trained with ({side}_trained_recursions={built})",
        fix=f"a trained model runs at depth 1 to {built}, e.g. --model-overrides \"{{'{side}_recursions': {built}}}\"",
    )


def _listed(value) -> int:
    """How many per-recursion values an option lists (``"2,1"`` -> 2)."""
    if isinstance(value, str):
        return len(value.split(","))
    return len(value) if isinstance(value, (list, tuple)) else 1


def record_trained_recursions(args) -> None:
    """At the first build, record ``--encoder/decoder-recursions`` as the trained counts
    (``{side}_trained_recursions``; an existing record, e.g. a checkpoint's, is kept)."""
    for side in ("encoder", "decoder"):
        if getattr(args, f"{side}_trained_recursions", None) is None:
            setattr(args, f"{side}_trained_recursions", getattr(args, f"{side}_recursions"))


def dictionary_fingerprint(dictionary) -> str:
    """A short hash of a fairseq dictionary's symbols in index order (counts ignored): what an
    embedding row means."""
    return hashlib.sha256("\n".join(dictionary.symbols).encode("utf-8")).hexdigest()[:16]


def check_dictionaries(args, task) -> None:
    """At the first build, record the fingerprints of the task's dictionaries
    (``{source,target}_dictionary_fingerprint``); when a checkpoint's configuration already
    records them, fail unless the task's dictionaries are the same: a data-bin with another
    dictionary of the same size would load, and translate nonsense."""
    for side in ("source", "target"):
        dictionary = getattr(task, f"{side}_dictionary", None)
        if dictionary is None or not hasattr(dictionary, "symbols"):
            continue
        key, found = f"{side}_dictionary_fingerprint", dictionary_fingerprint(dictionary)
        recorded = getattr(args, key, None)
        if recorded is None:
            setattr(args, key, found)
        elif recorded != found:
            raise ValueError(
                f"the data-bin's {side} dictionary ({len(dictionary)} symbols, fingerprint {found}) is not the one the"
                f" model was trained with (fingerprint {recorded}): translate with the data-bin the model was trained"
                " on (its dict.*.txt)")


def warn_untrained_depth(args) -> None:
    """Warn when a depth override runs a model at a depth its training did not include: the
    full depth, or a ``--mixed-depth`` term of its criterion
    (:func:`fairseq_sret.core.mixed_depth.untrained_depth_warning`). Said nothing of a
    configuration that does not record its criterion (fairseq-hydra-train keeps it apart from
    the model's)."""
    if getattr(args, "criterion", None) is None:
        return
    message = untrained_depth_warning(
        [getattr(args, f"{side}_recursions") for side in ("encoder", "decoder")],
        [getattr(args, f"{side}_trained_recursions") for side in ("encoder", "decoder")],
        getattr(args, "mixed_depth", None),
    )
    if message is not None:
        logger.warning(message)


def check_checkpoint_recursions(state_dict, name: str, recursive: Recursive, side: str) -> None:
    """A checkpoint's NLLs ``{name}.recursive.nlls.<r>`` must number the recursions the
    layer was built with; a mismatch (a checkpoint saved before the trained count was
    recorded, loaded with a depth override) fails saying which override fixes it."""
    prefix = f"{name}.recursive.nlls." if name else "recursive.nlls."
    found = {key[len(prefix):].split(".", 1)[0] for key in state_dict if key.startswith(prefix)}
    if recursive.nlls is None or not found:
        return
    saved = max(int(i) for i in found) + 1
    built = recursive.recursions
    if saved == built:
        return
    if saved > built:
        raise ValueError(
            f"{name}: the checkpoint holds NLLs for {saved} {side} recursions, the model was built with"
            f" {built}. A checkpoint saved before {side}_trained_recursions was recorded, run at depth"
            f" {built}, needs the trained count too: --model-overrides \"{{'{side}_recursions': {built},"
            f" '{side}_trained_recursions': {saved}}}\" (hub: from_pretrained(..., {side}_recursions={built},"
            f" {side}_trained_recursions={saved})); training from it needs --{side}-recursions {saved}"
        )
    raise ValueError(
        f"{name}: the checkpoint holds NLLs for {saved} {side} recursions, but the model was built"
        f" with {built}: it was trained with {saved} (train with --{side}-recursions {saved}, or give"
        f" '{side}_trained_recursions': {saved} in --model-overrides)"
    )


def check_sret_options(args) -> None:
    """Fail at model build, naming the option, for every invalid SReT configuration."""
    for side in ("encoder", "decoder"):
        recursion_schedule(args, side)
        dim = getattr(args, f"{side}_embed_dim")
        heads = getattr(args, f"{side}_attention_heads")
        if heads < 1 or dim % heads != 0:
            raise ValueError(
                f"--{side}-attention-heads={heads} must be >= 1 and divide --{side}-embed-dim={dim}"
            )
        if getattr(args, f"{side}_layers") < 1:
            raise ValueError(f"--{side}-layers must be >= 1")
        if getattr(args, f"{side}_ffn_embed_dim") < 1:
            raise ValueError(f"--{side}-ffn-embed-dim must be >= 1, got {getattr(args, f'{side}_ffn_embed_dim')}")
        if getattr(args, f"{side}_layers_to_keep", None):
            raise ValueError(f"--{side}-layers-to-keep (LayerDrop pruning) is not supported by sret_transformer")
    if not math.isfinite(args.nll_ratio) or args.nll_ratio < 0:
        raise ValueError(f"--nll-ratio must be a finite number >= 0 (0 disables the NLL), got {args.nll_ratio}")
    if args.encoder_embed_dim != args.decoder_embed_dim and not getattr(args, "no_cross_attention", False):
        raise ValueError(
            f"--encoder-embed-dim ({args.encoder_embed_dim}) must equal --decoder-embed-dim"
            f" ({args.decoder_embed_dim}): sret_transformer's cross-attention reads the encoder"
            " output at the decoder width"
        )
    for name in ("dropout", "attention_dropout", "activation_dropout", "relu_dropout"):
        value = getattr(args, name, None) or 0.0
        if not 0.0 <= value < 1.0:
            raise ValueError(f"--{name.replace('_', '-')} must be in [0, 1), got {value}")
    try:
        get_activation(args.activation_fn)
    except ValueError as exc:
        raise ValueError(f"--activation-fn: {exc}") from None
    for name in ("quant_noise_pq", "quant_noise_scalar"):
        if getattr(args, name, 0):
            raise ValueError(
                f"--{name.replace('_', '-')} is not supported by sret_transformer (its layers"
                " would silently train without quantization noise)"
            )
    if getattr(args, "encoder_layerdrop", 0) or getattr(args, "decoder_layerdrop", 0):
        raise ValueError("--encoder-layerdrop/--decoder-layerdrop are not supported by sret_transformer")
    if getattr(args, "cross_self_attention", False):
        raise ValueError("--cross-self-attention is not supported by sret_transformer")
    for side in ("encoder", "decoder"):
        if getattr(args, f"{side}_xformers_att_config", None):
            raise ValueError(
                f"--{side}-xformers-att-config is not supported by sret_transformer (its attention is"
                " its own: sliced group attention through scaled_dot_product_attention)"
            )
    if getattr(args, "base_layers", 0):
        raise ValueError("--base-layers (BASE mixture-of-experts layers) is not supported by sret_transformer")
    if getattr(args, "checkpoint_activations", False) or getattr(args, "offload_activations", False):
        raise ValueError(
            "--checkpoint-activations/--offload-activations wrap fairseq's own layers; use"
            " --checkpoint-recursions for sret_transformer"
        )


def set_default(args, name, value):
    if getattr(args, name, None) is None:
        setattr(args, name, value)


def sret_base_architecture(args):
    """Fill every option ``args`` leaves unset: the SReT defaults, then fairseq's transformer's."""
    defaults = SReTOptions()
    for name in SReTOptions.__dataclass_fields__:  # noqa: B007
        set_default(args, name, getattr(defaults, name))
    # The paper's blocks are pre-LN (Eq. 1, 7): LRC then scales un-normalised branches and
    # deep recursion stays trainable. fairseq's post-LN is available with --post-ln, which
    # then also leaves out the final layer norms, as fairseq's post-LN transformer does.
    set_default(args, "encoder_normalize_before", not args.post_ln)
    set_default(args, "decoder_normalize_before", not args.post_ln)
    base_architecture(args)
