"""fairseq encoder-decoder with recursive SReT layers (``--arch sret_transformer_*``).

Embeddings, positional embeddings, dropout, the output projection and embedding sharing
are fairseq's own (we subclass its transformer); only the layers differ
(:mod:`.layers`).
"""

from typing import Dict

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from omegaconf import OmegaConf

from ...core.depth import DepthControl
from .config import (SReTOptions, check_sret_options, record_trained_recursions, sret_base_architecture,
                     warn_untrained_depth)
from .hydra_config import namespace_from_config
from .layers import SReTDecoderLayer, SReTEncoderLayer


class SReTTransformerEncoder(TransformerEncoderBase):
    """fairseq's encoder with SReT layers. ``cfg``: fairseq's ``TransformerConfig`` of the
    options, which also carries the SReT options (``cfg.encoder_recursions``, ...)."""

    def build_encoder_layer(self, cfg):
        return SReTEncoderLayer(cfg)


class SReTTransformerDecoder(TransformerDecoderBase):
    """fairseq's decoder with SReT layers; ``cfg`` as for :class:`SReTTransformerEncoder`."""

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return SReTDecoderLayer(cfg, no_encoder_attn)


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
        """fairseq's ``TransformerModel.build_model`` (embeddings, their sharing or merging,
        positions, every inherited option) after the SReT defaults and checks; fairseq's
        ``TransformerConfig`` of ``args`` carries the SReT options to the layers."""
        if OmegaConf.is_config(args):  # fairseq-hydra-train's `model:` section, or its checkpoint
            args = namespace_from_config(cls, args, task)
        sret_base_architecture(args)
        record_trained_recursions(args)
        check_sret_options(args)
        warn_untrained_depth(args)
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return SReTTransformerEncoder(TransformerConfig.from_namespace(cfg), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(cfg)
        return SReTTransformerDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

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
