"""The transformers configuration of an SReT translation model (``model_type: sret_transformer``).

The fields are the fairseq options of the trained model under the same names (what
``sret-export-hf`` reads from a checkpoint). As there, ``{side}_recursions`` is the number of
applications the layers were built (and trained) with and ``{side}_depth`` how many of them run
(None: all of them): depth on demand, chosen at load time with
``from_pretrained(dir, encoder_depth=1)``; ``nll_ratio`` 0 means no NLL. They differ in:

- ``attention_layer``: the attention layer of every block, by the name it is registered under
  (:func:`~fairseq_sret.core.register_attention_layer`; fairseq's ``--attention-layer``);
- ``lrc`` is fairseq's ``not no_lrc``; ``{side}_normalize_before`` already takes ``--post-ln``
  into account;
- ``mixed_depth`` records the ``--mixed-depth`` terms of the training criterion ("" when it
  had none, None when the checkpoint did not say): the depths below the full depth the model
  was trained for, read by the warning for untrained depths;
- the dictionary sizes are ``vocab_size`` (source) and ``decoder_vocab_size`` (target);
- ``tokenizer_fingerprints``: the fingerprints of the tokenizer files the folder was exported
  with (:func:`~fairseq_sret.hf.tokenization.tokenizer_fingerprints`), checked when the model
  is loaded from the folder (None: a folder exported before they were recorded).

Every field is checked for its type when the configuration is made (a ``config.json`` value of
another type is one ValueError naming the field).
"""

import math
import types
import typing

from transformers import PretrainedConfig

from ..core import (
    ATTENTION_LAYERS, EncoderDecoderSpec, RecursionSchedule, RecursionSpec, SideSpec, SReTLayerSpec, check_depth,
    get_activation,
)

SIDES = ("encoder", "decoder")


class SReTConfig(PretrainedConfig):
    r"""Configuration of :class:`~fairseq_sret.hf.SReTForConditionalGeneration` (see the module
    docstring for the fields that differ from fairseq's options)."""

    model_type = "sret_transformer"
    attribute_map = {
        "hidden_size": "decoder_embed_dim",
        "d_model": "decoder_embed_dim",
        "num_attention_heads": "decoder_attention_heads",
    }

    vocab_size: int = 8
    decoder_vocab_size: int | None = None
    encoder_embed_dim: int = 512
    decoder_embed_dim: int = 512
    encoder_ffn_embed_dim: int = 2048
    decoder_ffn_embed_dim: int = 2048
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_layers: int = 3
    decoder_layers: int = 3
    encoder_recursions: int = 2
    decoder_recursions: int = 2
    encoder_depth: int | None = None
    decoder_depth: int | None = None
    encoder_groups: str = "1"
    decoder_groups: str = "1"
    encoder_partition: str = "auto"
    decoder_partition: str = "auto"
    nll_ratio: float = 1.0
    lrc: bool = True
    attention_layer: str = "sliced_group"
    encoder_normalize_before: bool = True
    decoder_normalize_before: bool = True
    no_decoder_final_norm: bool = False
    activation_fn: str = "relu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    max_source_positions: int = 1024
    max_target_positions: int = 1024
    encoder_learned_pos: bool = False
    decoder_learned_pos: bool = False
    no_token_positional_embeddings: bool = False
    no_scale_embedding: bool = False
    layernorm_embedding: bool = False
    decoder_output_dim: int | None = None
    share_all_embeddings: bool = False
    share_decoder_input_output_embed: bool = False
    mixed_depth: str | None = None
    tokenizer_fingerprints: dict | None = None
    is_encoder_decoder: bool = True
    use_cache: bool = True
    tie_word_embeddings: bool = False
    bos_token_id: int | None = 0
    pad_token_id: int | None = 1
    eos_token_id: int | None = 2
    unk_token_id: int = 3
    decoder_start_token_id: int | None = 2

    def __post_init__(self, **kwargs):
        check_field_types(self)  # as given, before the fields derived from others are filled
        self.decoder_vocab_size = self.decoder_vocab_size or self.vocab_size
        self.decoder_output_dim = self.decoder_output_dim or self.decoder_embed_dim
        # fairseq ties the output projection to the decoder's input embedding whenever the
        # embeddings are shared (share_all_embeddings implies it)
        self.share_decoder_input_output_embed = self.share_decoder_input_output_embed or self.share_all_embeddings
        self.tie_word_embeddings = self.share_decoder_input_output_embed
        super().__post_init__(**kwargs)
        self.validate_sret()

    def validate_sret(self) -> None:
        """Fail, naming the field, for every configuration the model cannot be built with (the
        depths are checked again where the model is built, after ``from_pretrained`` overrides)."""
        check_field_types(self)
        for side in SIDES:
            dim, heads = getattr(self, f"{side}_embed_dim"), getattr(self, f"{side}_attention_heads")
            if heads < 1 or dim % heads:
                raise ValueError(f"{side}_attention_heads={heads} must be >= 1 and divide {side}_embed_dim={dim}")
            for name in (f"{side}_layers", f"{side}_ffn_embed_dim"):
                check_depth(getattr(self, name), name=name)
        if self.encoder_embed_dim != self.decoder_embed_dim:
            raise ValueError(
                f"encoder_embed_dim ({self.encoder_embed_dim}) must equal decoder_embed_dim ({self.decoder_embed_dim}):"
                " the decoder's cross-attention reads the encoder output at its own width"
            )
        if self.share_all_embeddings and self.vocab_size != self.decoder_vocab_size:
            raise ValueError(
                f"share_all_embeddings needs one dictionary: vocab_size={self.vocab_size},"
                f" decoder_vocab_size={self.decoder_vocab_size}"
            )
        get_activation(self.activation_fn)
        if self.attention_layer not in ATTENTION_LAYERS:
            raise ValueError(f"attention_layer {self.attention_layer!r} is not a registered attention layer"
                             f" (registered: {ATTENTION_LAYERS.names()}); register it before loading the model")
        for side in SIDES:  # the rest, in the core's words (RecursionSpec.dropout, ...)
            read_side_spec(self, side)


_TYPE_NAMES = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string", dict: "an object"}


def _fits(value, kind) -> bool:
    if kind is type(None):
        return value is None
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, kind)


def check_field_types(config: SReTConfig) -> None:
    """Every field :class:`SReTConfig` declares has a value of its declared type (``int | None``:
    an integer or null), else a ValueError naming the field: what ``config.json`` gives is
    checked here, before any layer is built from it."""
    for name, declared in SReTConfig.__annotations__.items():
        kinds = typing.get_args(declared) if isinstance(declared, types.UnionType) else (declared,)
        if not all(isinstance(kind, type) for kind in kinds):
            continue
        value = getattr(config, name, None)
        if not any(_fits(value, kind) for kind in kinds):
            wanted = " or ".join("null" if kind is type(None) else _TYPE_NAMES.get(kind, kind.__name__) for kind in kinds)
            raise ValueError(f"SReTConfig.{name} must be {wanted}, got {value!r}")


def read_spec(config: SReTConfig) -> EncoderDecoderSpec:
    """The transformers adapter's reading of its configuration: the core's spec of the model's
    layers, the one the fairseq adapter reads from the options of the model exported
    (:func:`fairseq_sret.models.sret_transformer.read_spec`); errors name the fields."""
    return EncoderDecoderSpec(*(read_side_spec(config, side) for side in SIDES))


def read_side_spec(config: SReTConfig, side: str) -> SideSpec:
    """``side``'s layers: the trained schedule (``{side}_recursions`` applications, parsed once
    by the core's one parser) running ``{side}_depth`` of them (None: all)."""
    names = {name: f"{side}_{name}" for name in ("recursions", "groups", "partition", "depth")}
    schedule = RecursionSchedule.parse(
        getattr(config, f"{side}_recursions"), groups=getattr(config, f"{side}_groups"),
        partition=getattr(config, f"{side}_partition"), causal=side == "decoder", names=names,
        depth=getattr(config, f"{side}_depth"),
    )
    recursion = RecursionSpec(
        embed_dim=getattr(config, f"{side}_embed_dim"), schedule=schedule, lrc=config.lrc,
        nll_ratio=config.nll_ratio, activation=config.activation_fn, dropout=config.dropout,
        activation_dropout=config.activation_dropout,
    )
    layer = SReTLayerSpec(
        recursion=recursion, num_heads=getattr(config, f"{side}_attention_heads"),
        ffn_dim=getattr(config, f"{side}_ffn_embed_dim"), causal=side == "decoder",
        cross_attention=side == "decoder", normalize_before=getattr(config, f"{side}_normalize_before"),
        attention_dropout=config.attention_dropout, attention=config.attention_layer,
    )
    return SideSpec(layer=layer, layers=getattr(config, f"{side}_layers"))
