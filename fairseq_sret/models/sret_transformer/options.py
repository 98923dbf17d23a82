"""sret_transformer's own options and their defaults (everything else is fairseq's
transformer config): :class:`SReTOptions` declares them for fairseq's parser,
:func:`sret_base_architecture` fills what a command line leaves unset."""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import FairseqDataclass
from fairseq.models.transformer import base_architecture

from ...core.attention import DEFAULT_ATTENTION_LAYER
from ...core.partition import PARTITION_MODES


@dataclass
class SReTOptions(FairseqDataclass):
    """The SReT-specific options (everything else is fairseq's transformer config)."""

    encoder_recursions: int = field(
        default=2, metadata={"help": "applications each (weight-shared) encoder layer is built and trained with,"
                             " one NLL each"}
    )
    decoder_recursions: int = field(
        default=2, metadata={"help": "applications each (weight-shared) decoder layer is built and trained with,"
                             " one NLL each"}
    )
    encoder_depth: Optional[int] = field(
        default=None, metadata={"help": "applications of each encoder layer that run (default: all"
                                " --encoder-recursions): depth on demand, e.g. a checkpoint at depth 1 with"
                                " --model-overrides \"{'encoder_depth': 1}\""}
    )
    decoder_depth: Optional[int] = field(
        default=None, metadata={"help": "applications of each decoder layer that run (default: all"
                                " --decoder-recursions); see --encoder-depth"}
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
        default=1.0, metadata={"help": "hidden ratio of the NLL after every application (0: no NLL)"}
    )
    no_lrc: bool = field(
        default=False, metadata={"help": "plain residual connections instead of LRC"}
    )
    attention_layer: str = field(
        default=DEFAULT_ATTENTION_LAYER,
        metadata={"help": "the attention layer of every block, by the name it is registered under"
                  " (fairseq_sret.core.register_attention_layer; a module that registers one is imported"
                  " first, e.g. from --user-dir)"},
    )
    post_ln: bool = field(
        default=False, metadata={"help": "post-LN layers (fairseq's transformer default) instead"
                                 " of the pre-LN layers of the paper; overrides"
                                 " --encoder/decoder-normalize-before"}
    )
    keep_lrc_in_generation: bool = field(
        default=False, metadata={"help": "keep the LRC coefficients apart when fairseq prepares the model for"
                                 " generation, instead of folding them into the neighbouring weights (the same"
                                 " function up to float rounding, one element-wise operation per residual"
                                 " instead of two); at generation: --model-overrides"
                                 " \"{'keep_lrc_in_generation': True}\""}
    )
    int8_in_generation: bool = field(
        default=False, metadata={"help": "quantize the linear layers to int8 (torchao's dynamic int8, the"
                                 " configuration transformers loads with TorchAoConfig; needs the int8"
                                 " extra) when fairseq prepares the model for generation; in fp32 only;"
                                 " at generation: --model-overrides \"{'int8_in_generation': True}\""}
    )
    checkpoint_recursions: bool = field(
        default=False, metadata={"help": "activation checkpointing of every layer application:"
                                 " memory grows with unique layers, not total depth"}
    )
    # the older name of --{side}-recursions, kept so that the checkpoints that record it load
    # (fairseq and fairseq-hydra-train refuse a key no option declares): read by upgrade_depth_options
    encoder_trained_recursions: Optional[int] = field(
        default=None, metadata={"help": "the older name of --encoder-recursions in checkpoints saved before"
                                " --encoder-depth existed (read as --encoder-recursions, with a warning)"}
    )
    decoder_trained_recursions: Optional[int] = field(
        default=None, metadata={"help": "the older name of --decoder-recursions (see --encoder-trained-recursions)"}
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
