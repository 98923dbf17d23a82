"""The fairseq adapter's reading of its options: fairseq's flat options
(``--encoder-recursions``, ``--decoder-groups``, ...) -> the core's typed
:class:`~fairseq_sret.core.EncoderDecoderSpec` (:func:`read_spec`; one side:
:func:`read_side_spec`), a pure function on the options (an ``argparse.Namespace``, or the
``TransformerConfig`` fairseq builds from it). Every invalid configuration fails here, at model
build, naming the option; the layers are built from the spec, never from the options again.

The words for depth are the core's, as in the transformers configuration:
``--{side}-recursions`` is how many applications the layers are built (and trained) with, one
NLL each (the spec's ``recursions``), ``--{side}-depth`` how many of them run (the spec's
``depth``; default: all). Checkpoints saved before ``--{side}-depth`` existed are read in these
words first (:func:`~.trained_depth.upgrade_depth_options`).
"""

import math

from ...core import (
    ATTENTION_LAYERS, EncoderDecoderSpec, RecursionSchedule, RecursionSpec, SideSpec, SReTLayerSpec, get_activation,
)

SIDES = ("encoder", "decoder")


def read_spec(args) -> EncoderDecoderSpec:
    """The spec of ``args`` (defaults filled by :func:`~.options.sret_base_architecture`, a
    checkpoint's older depth options read by :func:`~.trained_depth.upgrade_depth_options`);
    ValueError naming the option for anything invalid."""
    check_model_options(args)
    return EncoderDecoderSpec(*(read_side_spec(args, side) for side in SIDES))


def check_sret_options(args) -> None:
    """Fail, naming the option, for every invalid SReT configuration (:func:`read_spec`)."""
    read_spec(args)


def read_side_spec(args, side: str) -> SideSpec:
    """``side``'s layers (its schedule parsed once); ValueError naming the option."""
    schedule = recursion_schedule(args, side)
    _check_side_options(args, side)
    # fairseq's older name of the activation dropout counts when --activation-dropout is 0
    activation_dropout = args.activation_dropout or getattr(args, "relu_dropout", None) or 0.0
    recursion = RecursionSpec(
        embed_dim=getattr(args, f"{side}_embed_dim"),
        schedule=schedule,
        lrc=not args.no_lrc,
        nll_ratio=args.nll_ratio,
        activation=args.activation_fn,
        dropout=args.dropout,
        activation_dropout=activation_dropout,
        checkpoint=args.checkpoint_recursions,
    )
    layer = SReTLayerSpec(
        recursion=recursion,
        num_heads=getattr(args, f"{side}_attention_heads"),
        ffn_dim=getattr(args, f"{side}_ffn_embed_dim"),
        causal=side == "decoder",
        cross_attention=side == "decoder" and not getattr(args, "no_cross_attention", False),
        normalize_before=(not args.post_ln) and getattr(args, f"{side}_normalize_before"),
        attention_dropout=args.attention_dropout,
        attention=args.attention_layer,
    )
    return SideSpec(layer=layer, layers=getattr(args, f"{side}_layers"))


def recursion_schedule(args, side: str) -> RecursionSchedule:
    """The recursion schedule of ``side``'s layers from the command-line options: built with
    ``--{side}-recursions`` applications, running the first ``--{side}-depth`` of them (None:
    all; a checkpoint runs shallower with ``--model-overrides "{'encoder_depth': 1}"``, keeping
    every NLL it was trained with and loading strictly).

    Errors name the options (``--encoder-groups``, ...). ``auto`` partitions resolve to
    contiguous-then-random (encoder) and strided-then-random (decoder, causal).
    """
    recursions, depth = getattr(args, f"{side}_recursions"), getattr(args, f"{side}_depth", None)
    names = {name: f"--{side}-{name}" for name in ("recursions", "groups", "partition", "depth")}
    groups, partition = getattr(args, f"{side}_groups"), getattr(args, f"{side}_partition")
    try:
        return RecursionSchedule.parse(
            recursions, groups=groups, partition=partition, causal=side == "decoder", names=names, depth=depth,
        )
    except ValueError as exc:
        listed = max(listed_values(groups), listed_values(partition))
        if isinstance(recursions, int) and 1 <= recursions < listed:
            raise ValueError(
                f"{exc}. (Running a trained model shallower? --{side}-recursions is the applications its"
                f" layers were built with; the depth that runs is --{side}-depth: --model-overrides"
                f" \"{{'{side}_depth': {recursions}}}\")"
            ) from None
        if isinstance(recursions, int) and 1 < listed < recursions:
            raise ValueError(
                f"{exc}. If this is a trained model, --{side}-recursions={recursions} is larger than the {listed}"
                f" recursions this model was trained with: it runs at depth 1 to {listed} (--{side}-depth)"
            ) from None
        raise


def listed_values(value) -> int:
    """How many per-recursion values an option lists (``"2,1"`` -> 2)."""
    if isinstance(value, str):
        return len(value.split(","))
    return len(value) if isinstance(value, (list, tuple)) else 1


def _check_side_options(args, side: str) -> None:
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


def check_model_options(args) -> None:
    """Fail, naming the option, for the invalid options that are not one side's layers."""
    if not math.isfinite(args.nll_ratio) or args.nll_ratio < 0:
        raise ValueError(f"--nll-ratio must be a finite number >= 0 (0: no NLL), got {args.nll_ratio}")
    width = args.nll_ratio * max(args.encoder_embed_dim, args.decoder_embed_dim)
    if width >= 2 ** 31:
        raise ValueError(f"--nll-ratio {args.nll_ratio} gives NLLs {width:.3g} wide, more than a tensor can hold")
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
    if args.attention_layer not in ATTENTION_LAYERS:
        raise ValueError(f"--attention-layer {args.attention_layer!r} is not a registered attention layer (registered:"
                         f" {ATTENTION_LAYERS.names()})")
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
