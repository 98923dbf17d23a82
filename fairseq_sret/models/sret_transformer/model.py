"""fairseq encoder-decoder with recursive SReT layers (``--arch sret_transformer_*``).

Embeddings, positional embeddings, dropout, the output projection and embedding sharing
are fairseq's own (we subclass its transformer); only the layers differ. Each fairseq
"layer" here is one *unique* layer applied ``recursions`` times (weights shared), with a
non-shared NLL after every application (paper Eq. 6), LRC on every residual (Eq. 7-8)
and sliced group self-attention (Sec. 4), all from :mod:`fairseq_sret.core`.
"""

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from omegaconf import OmegaConf
from torch import Tensor, nn

from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    DEFAULT_MAX_SOURCE_POSITIONS,
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
)

from ..core import NonLinearProjection, RecursionSchedule, Recursive, SReTBlock, get_activation, reorder_cache
from ..core import depth as recursion_depth
from ..core.partition import PARTITION_MODES
from .hydra_config import namespace_from_config


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
    if isinstance(recursions, int) and not isinstance(recursions, bool) and recursions > built:
        raise ValueError(
            f"--{side}-recursions={recursions} is larger than the {built} recursions this model was"
            f" trained with ({side}_trained_recursions={built}); a trained model runs at depth 1 to"
            f" {built}, e.g. --model-overrides \"{{'{side}_recursions': {built}}}\""
        )
    return schedule.with_depth(recursions, name=f"--{side}-recursions")


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
    for name in ("dropout", "attention_dropout", "activation_dropout"):
        value = getattr(args, name, 0.0)
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
    if getattr(args, "checkpoint_activations", False) or getattr(args, "offload_activations", False):
        raise ValueError(
            "--checkpoint-activations/--offload-activations wrap fairseq's own layers; use"
            " --checkpoint-recursions for sret_transformer"
        )


def build_recursive_block(args, side: str, causal: bool, cross_attention: bool) -> Recursive:
    schedule = recursion_schedule(args, side)
    dim = getattr(args, f"{side}_embed_dim")
    normalize_before = (not args.post_ln) and getattr(args, f"{side}_normalize_before")
    block = SReTBlock(
        embed_dim=dim,
        num_heads=getattr(args, f"{side}_attention_heads"),
        ffn_dim=getattr(args, f"{side}_ffn_embed_dim"),
        schedule=schedule,
        causal=causal,
        cross_attention=cross_attention,
        normalize_before=normalize_before,
        lrc=not args.no_lrc,
        dropout=args.dropout,
        attention_dropout=args.attention_dropout,
        activation_dropout=args.activation_dropout,
        activation=args.activation_fn,
    )
    make_nll = None
    if args.nll_ratio > 0:
        def make_nll(_index):
            return NonLinearProjection(
                dim, args.nll_ratio, lrc=not args.no_lrc, activation=args.activation_fn,
                dropout=args.dropout, activation_dropout=args.activation_dropout,
            )
    return Recursive(block, schedule, make_nll, checkpoint=args.checkpoint_recursions)


class SReTEncoderLayer(nn.Module):
    """One unique encoder layer applied ``recursions`` times; fairseq's layer interface."""

    def __init__(self, args):
        super().__init__()
        self.recursive = build_recursive_block(args, "encoder", causal=False, cross_attention=False)

    def forward(self, x: Tensor, encoder_padding_mask: Optional[Tensor], attn_mask=None) -> Tensor:
        """x: (T, B, C), encoder_padding_mask: (B, T) True at padding -> (T, B, C)"""
        if attn_mask is not None:
            raise NotImplementedError("sret_transformer encoder layers take no attn_mask")
        # (B, T, C) made contiguous once (free from the second layer on, whose input is the
        # transposed view of this output): a strided residual stream makes every LayerNorm
        # copy its input, and its gradients trip AOTAutograd's view replay under torch.compile
        x = x.transpose(0, 1).contiguous()
        return self.recursive(x, key_padding_mask=encoder_padding_mask).transpose(0, 1)

    def upgrade_state_dict_named(self, state_dict, name):
        check_checkpoint_recursions(state_dict, name, self.recursive, "encoder")
        return state_dict


@with_incremental_state
class SReTDecoderLayer(nn.Module):
    """One unique decoder layer applied ``recursions`` times.

    During incremental decoding every application keeps its own cache (keys/values of the
    self-attention and the projected encoder output), stored under this module's
    incremental-state key; ``reorder_incremental_state`` reorders all of them.
    """

    def __init__(self, args, no_encoder_attn: bool = False):
        super().__init__()
        self.recursive = build_recursive_block(
            args, "decoder", causal=True, cross_attention=not no_encoder_attn
        )

    def _caches(self, incremental_state) -> Optional[List[dict]]:
        if incremental_state is None:
            return None
        state = self.get_incremental_state(incremental_state, "recursions")
        if state is None:
            state = {"caches": [{} for _ in range(self.recursive.recursions)]}
            self.set_incremental_state(incremental_state, "recursions", state)
        return state["caches"]

    def forward(
        self,
        x: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state=None,
        prev_attn_state=None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        """x: (T, B, C); encoder_out: (S, B, C). Returns (x, None, None) like fairseq's layer.

        Causality is built into the attention module, so ``self_attn_mask`` (fairseq's
        future mask) only signals a full (non-incremental) causal forward.
        """
        if incremental_state is None and self_attn_mask is None:
            raise NotImplementedError(
                "sret_transformer decoder layers are always causal (full_context_alignment is not supported)"
            )
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("prev_self_attn_state/prev_attn_state are not supported")
        memory = None if encoder_out is None else encoder_out.transpose(0, 1)
        out = self.recursive(
            x.transpose(0, 1).contiguous(),  # see SReTEncoderLayer.forward
            key_padding_mask=self_attn_padding_mask,
            memory=memory,
            memory_padding_mask=encoder_padding_mask,
            caches=self._caches(incremental_state),
        )
        # Attention weights are not materialised (fused attention); alignment is unsupported.
        return out.transpose(0, 1), None, None

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        state = self.get_incremental_state(incremental_state, "recursions")
        if state is not None:
            for cache in state["caches"]:
                for attention_cache in cache.values():
                    reorder_cache(attention_cache, new_order)

    def upgrade_state_dict_named(self, state_dict, name):
        check_checkpoint_recursions(state_dict, name, self.recursive, "decoder")
        return state_dict


class SReTTransformerEncoder(TransformerEncoderBase):
    def __init__(self, args, dictionary, embed_tokens):
        self.args = args
        super().__init__(TransformerConfig.from_namespace(args), dictionary, embed_tokens)

    def build_encoder_layer(self, cfg):
        return SReTEncoderLayer(self.args)


class SReTTransformerDecoder(TransformerDecoderBase):
    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=False):
        self.args = args
        super().__init__(
            TransformerConfig.from_namespace(args), dictionary, embed_tokens,
            no_encoder_attn=no_encoder_attn,
        )

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return SReTDecoderLayer(self.args, no_encoder_attn)


@register_model("sret_transformer")
class SReTTransformerModel(TransformerModel):
    """Sliced Recursive Transformer for sequence-to-sequence tasks.

    ``--encoder-layers``/``--decoder-layers`` count *unique* layers; the number of layer
    applications is layers x recursions.
    """

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        gen_parser_from_dataclass(parser, SReTOptions(), delete_default=True)

    @classmethod
    def build_model(cls, args, task):
        """Like fairseq's TransformerModel.build_model, keeping the argparse namespace
        (which carries the SReT options) for the encoder and decoder."""
        if OmegaConf.is_config(args):  # fairseq-hydra-train's `model:` section, or its checkpoint
            args = namespace_from_config(cls, args, task)
        sret_base_architecture(args)
        record_trained_recursions(args)
        check_sret_options(args)
        if getattr(args, "max_source_positions", None) is None:
            args.max_source_positions = DEFAULT_MAX_SOURCE_POSITIONS
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = DEFAULT_MAX_TARGET_POSITIONS
        src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
        if args.share_all_embeddings:
            if src_dict != tgt_dict:
                raise ValueError("--share-all-embeddings requires a joined dictionary")
            if args.encoder_embed_dim != args.decoder_embed_dim:
                raise ValueError(
                    "--share-all-embeddings requires --encoder-embed-dim to match --decoder-embed-dim"
                )
            encoder_embed = cls.build_embedding(args, src_dict, args.encoder_embed_dim, args.encoder_embed_path)
            decoder_embed = encoder_embed
            args.share_decoder_input_output_embed = True
        else:
            encoder_embed = cls.build_embedding(args, src_dict, args.encoder_embed_dim, args.encoder_embed_path)
            decoder_embed = cls.build_embedding(args, tgt_dict, args.decoder_embed_dim, args.decoder_embed_path)
        encoder = cls.build_encoder(args, src_dict, encoder_embed)
        decoder = cls.build_decoder(args, tgt_dict, decoder_embed)
        return cls(args, encoder, decoder)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return SReTTransformerEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return SReTTransformerDecoder(
            args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False)
        )

    # ------------------------------------------------------------ depth on demand
    @property
    def trained_recursions(self) -> Tuple[int, int]:
        """(encoder, decoder): the recursions the layers were built (and trained) with."""
        return recursion_depth.built_recursions(self.encoder), recursion_depth.built_recursions(self.decoder)

    @property
    def depth(self) -> Tuple[int, int]:
        """(encoder, decoder): the applications of each layer that run."""
        return recursion_depth.current_depth(self.encoder), recursion_depth.current_depth(self.decoder)

    def set_depth(self, encoder: Optional[int] = None, decoder: Optional[int] = None) -> None:
        """Run the first ``encoder`` / ``decoder`` applications of every layer (None: all
        the trained ones); the others and their NLLs are skipped. Both are checked first."""
        recursion_depth.check_depth(self.encoder, encoder, name="encoder depth")
        recursion_depth.check_depth(self.decoder, decoder, name="decoder depth")
        recursion_depth.set_depth(self.encoder, encoder, name="encoder depth")
        recursion_depth.set_depth(self.decoder, decoder, name="decoder depth")

    @contextmanager
    def at_depth(self, encoder: Optional[int] = None, decoder: Optional[int] = None) -> Iterator["SReTTransformerModel"]:
        """Temporarily run at ``encoder`` / ``decoder`` depth (None: all the trained
        applications); the previous depths come back on exit."""
        with recursion_depth.at_depth(self.encoder, encoder, name="encoder depth"), \
                recursion_depth.at_depth(self.decoder, decoder, name="decoder depth"):
            yield self

    def lrc_coefficients(self) -> Dict[str, float]:
        """Every LRC coefficient by parameter name (for plots and logs)."""
        return {
            name: float(p.detach())
            for name, p in self.named_parameters()
            if name.endswith(("skip_scale", "branch_scale"))
        }


# ---------------------------------------------------------------- architectures
def _set_default(args, name, value):
    if getattr(args, name, None) is None:
        setattr(args, name, value)


def sret_base_architecture(args):
    defaults = SReTOptions()
    for name in SReTOptions.__dataclass_fields__:  # noqa: B007
        _set_default(args, name, getattr(defaults, name))
    # The paper's blocks are pre-LN (Eq. 1, 7): LRC then scales un-normalised branches and
    # deep recursion stays trainable. fairseq's post-LN is available with --post-ln, which
    # then also leaves out the final layer norms, as fairseq's post-LN transformer does.
    _set_default(args, "encoder_normalize_before", not args.post_ln)
    _set_default(args, "decoder_normalize_before", not args.post_ln)
    base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer")
def sret_transformer(args):
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_iwslt_de_en")
def sret_transformer_iwslt_de_en(args):
    # fairseq's transformer_iwslt_de_en widths; 3 unique layers x 2 recursions = the same 6
    # layer applications with half the layer parameters (NLLs add 0.5M per application).
    _set_default(args, "encoder_embed_dim", 512)
    _set_default(args, "encoder_ffn_embed_dim", 1024)
    _set_default(args, "encoder_attention_heads", 4)
    _set_default(args, "encoder_layers", 3)
    _set_default(args, "decoder_embed_dim", 512)
    _set_default(args, "decoder_ffn_embed_dim", 1024)
    _set_default(args, "decoder_attention_heads", 4)
    _set_default(args, "decoder_layers", 3)
    _set_default(args, "encoder_recursions", 2)
    _set_default(args, "decoder_recursions", 2)
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_wmt_en_de")
def sret_transformer_wmt_en_de(args):
    # transformer_wmt_en_de widths (512/2048, 8 heads); 3 unique layers x 2 recursions.
    _set_default(args, "encoder_layers", 3)
    _set_default(args, "decoder_layers", 3)
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_wmt_en_de_big")
def sret_transformer_wmt_en_de_big(args):
    # transformer_vaswani_wmt_en_de_big widths (1024/4096, 16 heads, dropout 0.3).
    _set_default(args, "encoder_embed_dim", 1024)
    _set_default(args, "encoder_ffn_embed_dim", 4096)
    _set_default(args, "encoder_attention_heads", 16)
    _set_default(args, "decoder_embed_dim", 1024)
    _set_default(args, "decoder_ffn_embed_dim", 4096)
    _set_default(args, "decoder_attention_heads", 16)
    _set_default(args, "dropout", 0.3)
    _set_default(args, "encoder_layers", 3)
    _set_default(args, "decoder_layers", 3)
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_tiny")
def sret_transformer_tiny(args):
    # CPU demos and tests: width 256, FFN 1024, 4 heads, 2 unique layers x 2 recursions per
    # side, NLL ratio 0.5.
    _set_default(args, "encoder_embed_dim", 256)
    _set_default(args, "encoder_ffn_embed_dim", 1024)
    _set_default(args, "encoder_attention_heads", 4)
    _set_default(args, "encoder_layers", 2)
    _set_default(args, "decoder_embed_dim", 256)
    _set_default(args, "decoder_ffn_embed_dim", 1024)
    _set_default(args, "decoder_attention_heads", 4)
    _set_default(args, "decoder_layers", 2)
    _set_default(args, "nll_ratio", 0.5)
    sret_base_architecture(args)
