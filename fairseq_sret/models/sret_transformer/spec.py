"""Reading sret_transformer's options once: fairseq's flat options (``--encoder-recursions``,
``--decoder-groups``, ...) -> one typed :class:`~fairseq_sret.core.SReTLayerSpec` per side
(:func:`read_spec`), every invalid configuration failing here, at model build, naming the
option. The layers are built from the spec, never from the options again."""

import math
from dataclasses import dataclass

from ...core import RecursionSchedule, SReTLayerSpec, get_activation


@dataclass(frozen=True)
class TranslationSpec:
    """The unique encoder and decoder layer of an sret_transformer, and how many of each."""

    encoder: SReTLayerSpec
    decoder: SReTLayerSpec
    encoder_layers: int
    decoder_layers: int


def read_spec(args) -> TranslationSpec:
    """The spec of ``args`` (defaults filled by :func:`~.options.sret_base_architecture`,
    trained recursions recorded); ValueError naming the option for anything invalid."""
    check_sret_options(args)
    return TranslationSpec(
        encoder=_layer_spec(args, "encoder", cross_attention=False),
        decoder=_layer_spec(args, "decoder", cross_attention=not getattr(args, "no_cross_attention", False)),
        encoder_layers=args.encoder_layers,
        decoder_layers=args.decoder_layers,
    )


def _layer_spec(args, side: str, cross_attention: bool) -> SReTLayerSpec:
    option = {name: getattr(args, f"{side}_{name}") for name in
              ("embed_dim", "attention_heads", "ffn_embed_dim", "normalize_before")}
    # fairseq's older name of the activation dropout counts when --activation-dropout is 0
    activation_dropout = args.activation_dropout or getattr(args, "relu_dropout", None) or 0.0
    return SReTLayerSpec(
        embed_dim=option["embed_dim"],
        num_heads=option["attention_heads"],
        ffn_dim=option["ffn_embed_dim"],
        schedule=recursion_schedule(args, side),
        causal=side == "decoder",
        cross_attention=cross_attention,
        normalize_before=(not args.post_ln) and option["normalize_before"],
        lrc=not args.no_lrc,
        nll_ratio=args.nll_ratio,
        activation=args.activation_fn,
        dropout=args.dropout,
        attention_dropout=args.attention_dropout,
        activation_dropout=activation_dropout,
        checkpoint=args.checkpoint_recursions,
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


def check_sret_options(args) -> None:
    """Fail at model build, naming the option, for every invalid SReT configuration."""
    for side in ("encoder", "decoder"):
        recursion_schedule(args, side)  # each side's schedule options, named in its errors
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
