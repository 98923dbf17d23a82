"""The named ``sret_transformer`` architectures (``--arch``), as fairseq's
``transformer_legacy`` names its transformer's."""

from fairseq.models import register_model_architecture

from .config import set_default, sret_base_architecture
from .model import SReTTransformerModel  # noqa: F401  (registers the model the architectures name)


@register_model_architecture("sret_transformer", "sret_transformer")
def sret_transformer(args):
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_iwslt_de_en")
def sret_transformer_iwslt_de_en(args):
    # fairseq's transformer_iwslt_de_en widths; 3 unique layers x 2 recursions = the same 6
    # layer applications with half the layer parameters (NLLs add 0.5M per application).
    set_default(args, "encoder_embed_dim", 512)
    set_default(args, "encoder_ffn_embed_dim", 1024)
    set_default(args, "encoder_attention_heads", 4)
    set_default(args, "encoder_layers", 3)
    set_default(args, "decoder_embed_dim", 512)
    set_default(args, "decoder_ffn_embed_dim", 1024)
    set_default(args, "decoder_attention_heads", 4)
    set_default(args, "decoder_layers", 3)
    set_default(args, "encoder_recursions", 2)
    set_default(args, "decoder_recursions", 2)
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_wmt_en_de")
def sret_transformer_wmt_en_de(args):
    # transformer_wmt_en_de widths (512/2048, 8 heads); 3 unique layers x 2 recursions.
    set_default(args, "encoder_layers", 3)
    set_default(args, "decoder_layers", 3)
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_wmt_en_de_big")
def sret_transformer_wmt_en_de_big(args):
    # transformer_vaswani_wmt_en_de_big widths (1024/4096, 16 heads, dropout 0.3).
    set_default(args, "encoder_embed_dim", 1024)
    set_default(args, "encoder_ffn_embed_dim", 4096)
    set_default(args, "encoder_attention_heads", 16)
    set_default(args, "decoder_embed_dim", 1024)
    set_default(args, "decoder_ffn_embed_dim", 4096)
    set_default(args, "decoder_attention_heads", 16)
    set_default(args, "dropout", 0.3)
    set_default(args, "encoder_layers", 3)
    set_default(args, "decoder_layers", 3)
    sret_base_architecture(args)


@register_model_architecture("sret_transformer", "sret_transformer_tiny")
def sret_transformer_tiny(args):
    # CPU demos and tests: width 256, FFN 1024, 4 heads, 2 unique layers x 2 recursions per
    # side, NLL ratio 0.5.
    set_default(args, "encoder_embed_dim", 256)
    set_default(args, "encoder_ffn_embed_dim", 1024)
    set_default(args, "encoder_attention_heads", 4)
    set_default(args, "encoder_layers", 2)
    set_default(args, "decoder_embed_dim", 256)
    set_default(args, "decoder_ffn_embed_dim", 1024)
    set_default(args, "decoder_attention_heads", 4)
    set_default(args, "decoder_layers", 2)
    set_default(args, "nll_ratio", 0.5)
    sret_base_architecture(args)
