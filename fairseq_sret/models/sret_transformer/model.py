"""fairseq encoder-decoder with recursive SReT layers (``--arch sret_transformer_*``).

Embeddings, positional embeddings, dropout, the output projection and embedding sharing
are fairseq's own (we subclass its transformer); only the layers differ
(:mod:`.layers`).
"""

import contextlib
import contextvars
import re
from typing import Dict, Iterator

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from omegaconf import OmegaConf

from ...core import SReTLayerSpec
from ...core.depth import DepthControl
from .dictionaries import check_dictionaries
from .hydra_config import namespace_from_config
from .layers import SReTDecoderLayer, SReTEncoderLayer
from .options import SReTOptions, sret_base_architecture
from .spec import TranslationSpec, read_spec
from .trained_depth import record_trained_recursions, warn_untrained_depth

#: the spec of the model being built: fairseq's build_model hands build_encoder/_decoder its
#: own TransformerConfig, so the spec read from the options travels beside it
_BUILDING: contextvars.ContextVar = contextvars.ContextVar("sret_transformer_spec", default=None)


@contextlib.contextmanager
def _building(spec: TranslationSpec) -> Iterator[None]:
    token = _BUILDING.set(spec)
    try:
        yield
    finally:
        _BUILDING.reset(token)


def _spec_being_built() -> TranslationSpec:
    spec = _BUILDING.get()
    if spec is None:
        raise RuntimeError("sret_transformer encoders and decoders are built by SReTTransformerModel.build_model,"
                           " which reads the options into their spec")
    return spec


class SReTTransformerEncoder(TransformerEncoderBase):
    """fairseq's encoder (embeddings, positions, final norm) with ``cfg.encoder_layers``
    SReT layers, each built from ``layer_spec``."""

    def __init__(self, cfg, layer_spec: SReTLayerSpec, dictionary, embed_tokens):
        self.layer_spec = layer_spec  # read by build_encoder_layer, called by fairseq's __init__
        super().__init__(cfg, dictionary, embed_tokens)

    def build_encoder_layer(self, cfg):
        return SReTEncoderLayer(self.layer_spec)


class SReTTransformerDecoder(TransformerDecoderBase):
    """fairseq's decoder (embeddings, positions, output projection) with SReT layers built
    from ``layer_spec``."""

    def __init__(self, cfg, layer_spec: SReTLayerSpec, dictionary, embed_tokens, no_encoder_attn=False):
        self.layer_spec = layer_spec
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return SReTDecoderLayer(self.layer_spec)


@register_model("sret_transformer")
class SReTTransformerModel(DepthControl, TransformerModel):
    """Sliced Recursive Transformer for sequence-to-sequence tasks.

    ``--encoder-layers``/``--decoder-layers`` count *unique* layers; the number of layer
    applications is layers x recursions.
    """

    #: the trainer's update count, set before every training step (read by ``--depth-warmup``)
    num_updates: int = 0

    @classmethod
    def hub_models(cls):
        return {}

    def set_num_updates(self, num_updates):
        super().set_num_updates(num_updates)
        self.num_updates = num_updates

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        gen_parser_from_dataclass(parser, SReTOptions(), delete_default=True)

    @classmethod
    def build_model(cls, args, task):
        """fairseq's ``TransformerModel.build_model`` (embeddings, their sharing or merging,
        positions, every inherited option) after the SReT defaults; the SReT options are read
        once, here, into the spec the layers are built from."""
        if OmegaConf.is_config(args):  # fairseq-hydra-train's `model:` section, or its checkpoint
            args = namespace_from_config(cls, args, task)
        sret_base_architecture(args)
        record_trained_recursions(args)
        spec = read_spec(args)
        check_dictionaries(args, task)
        warn_untrained_depth(args)
        with _building(spec):
            return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return SReTTransformerEncoder(TransformerConfig.from_namespace(cfg), _spec_being_built().encoder,
                                      src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(cfg)
        return SReTTransformerDecoder(cfg, _spec_being_built().decoder, tgt_dict, embed_tokens,
                                      no_encoder_attn=cfg.no_cross_attention)

    # ------------------------------------------------------------ depth on demand
    # model.recursions and model.depth are (encoder, decoder); model.set_depth(1, 2) and
    # ``with model.at_depth(1, 2):`` choose both (None: every trained application)
    depth_sides = ("encoder", "decoder")

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's strict load; weights that do not fit (an override such as
        ``encoder_layers`` or a width, which a trained model cannot take) fail with one line
        that counts and names the mismatches."""
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError as exc:
            if "Error(s) in loading state_dict" not in str(exc):
                raise
            raise ValueError(weights_mismatch(str(exc))) from None

    def lrc_coefficients(self) -> Dict[str, float]:
        """Every LRC coefficient by parameter name (for plots and logs)."""
        return {
            name: float(p.detach())
            for name, p in self.named_parameters()
            if name.endswith(("skip_scale", "branch_scale"))
        }


def weights_mismatch(torch_message: str) -> str:
    """torch's multi-line strict-load error as one line: how many keys are missing, unexpected
    or of another shape, the first of each, and what an override may change."""
    def keys(label):
        match = re.search(label + r" key\(s\) in state_dict: (.*)", torch_message)
        return re.findall(r'"([^"]+)"', match.group(1)) if match else []

    missing, unexpected = keys("Missing"), keys("Unexpected")
    shapes = re.findall(r"size mismatch for ([^:]+): copying a param with shape torch.Size\((\[[^]]*\])\) from"
                        r" checkpoint, the shape in current model is torch.Size\((\[[^]]*\])\)", torch_message)
    vocab = [(n, a, b) for n, a, b in shapes if n.endswith(("embed_tokens.weight", "output_projection.weight"))]
    if vocab:
        name, saved, built = vocab[0]
        return (f"the data-bin's dictionary does not match the checkpoint's ({name}: {saved} in the checkpoint,"
                f" {built} with this data-bin's dictionary): translate with the data-bin the model was trained on")
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing (e.g. {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
    if shapes:
        name, saved, built = shapes[0]
        parts.append(f"{len(shapes)} of another shape (e.g. {name}: {saved} in the checkpoint, {built} in the model)")
    return ("the checkpoint's weights do not fit the model its configuration (with any --model-overrides) builds: "
            + "; ".join(parts or [torch_message.splitlines()[0]])
            + ". Overrides may change the depth (encoder_recursions, decoder_recursions) and options that keep"
              " the weights' shapes, not layer counts or widths")
