"""fairseq encoder-decoder with recursive SReT layers (``--arch sret_transformer_*``).

Embeddings, positional embeddings, dropout, the output projection and embedding sharing
are fairseq's own (we subclass its transformer); only the layers differ
(:mod:`.layers`).
"""

from typing import Dict

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model
from fairseq.models.transformer import (
    DEFAULT_MAX_SOURCE_POSITIONS,
    DEFAULT_MAX_TARGET_POSITIONS,
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from omegaconf import OmegaConf

from ...core.depth import DepthControl
from .config import SReTOptions, check_sret_options, record_trained_recursions, sret_base_architecture
from .hydra_config import namespace_from_config
from .layers import SReTDecoderLayer, SReTEncoderLayer


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
class SReTTransformerModel(DepthControl, TransformerModel):
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
    # model.recursions and model.depth are (encoder, decoder); model.set_depth(1, 2) and
    # ``with model.at_depth(1, 2):`` choose both (None: every trained application)
    depth_sides = ("encoder", "decoder")

    def lrc_coefficients(self) -> Dict[str, float]:
        """Every LRC coefficient by parameter name (for plots and logs)."""
        return {
            name: float(p.detach())
            for name, p in self.named_parameters()
            if name.endswith(("skip_scale", "branch_scale"))
        }
