"""The named ``sret_transformer`` architectures (``--arch``), as fairseq's
``transformer_legacy`` names its transformer's."""

from fairseq.models import register_model_architecture

from .options import set_default, sret_base_architecture
from .model import SReTTransformerModel  # noqa: F401  (registers the model the architectures name)


def set_widths(args, embed_dim: int, ffn_dim: int, heads: int, layers: int) -> None:
    """The same width, FFN size, heads and unique layers on both sides (where not given)."""
    for side in ("encoder", "decoder"):
        set_default(args, f"{side}_embed_dim", embed_dim)
        set_default(args, f"{side}_ffn_embed_dim", ffn_dim)
        set_default(args, f"{side}_attention_heads", heads)
        set_default(args, f"{side}_layers", layers)


@register_model_architecture("sret_transformer", "sret_transformer")
def sret_transformer(args):
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_iwslt_de_en")
def sret_transformer_iwslt_de_en(args):
    # fairseq's transformer_iwslt_de_en widths; 3 unique layers x 2 recursions = the same 6
    # layer applications with half the layer parameters (NLLs add 0.5M per application).
    set_widths(args, 512, 1024, 4, layers=3)
    set_default(args, "encoder_recursions", 2)
    set_default(args, "decoder_recursions", 2)
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_wmt_en_de")
def sret_transformer_wmt_en_de(args):
    # transformer_wmt_en_de widths (fairseq's defaults, 512/2048, 8 heads, the decoder's
    # following the encoder's); 3 unique layers x 2 recursions.
    set_default(args, "encoder_layers", 3)
    set_default(args, "decoder_layers", 3)
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_wmt_en_de_big")
def sret_transformer_wmt_en_de_big(args):
    # transformer_vaswani_wmt_en_de_big widths (1024/4096, 16 heads, dropout 0.3).
    set_widths(args, 1024, 4096, 16, layers=3)
    set_default(args, "dropout", 0.3)
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_tiny")
def sret_transformer_tiny(args):
    # CPU demos and tests: width 256, FFN 1024, 4 heads, 2 unique layers x 2 recursions per
    # side, NLL ratio 0.5.
    set_widths(args, 256, 1024, 4, layers=2)
    set_default(args, "nll_ratio", 0.5)
    sret_base_architecture(args)
