"""fairseq encoder-decoder with recursive SReT layers (``--arch sret_transformer_*``).

Embeddings, positional embeddings, dropout, the output projection and embedding sharing
are fairseq's own (we subclass its transformer); only the layers differ
(:mod:`.layers`).
"""

import logging
import re
from argparse import Namespace
from types import SimpleNamespace
from typing import Dict

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.models import register_model
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
)
from omegaconf import OmegaConf
from torch import nn

from ...core import SideSpec, fold_lrc
from ...core.depth import DepthControl
from ...core.int8 import quantize_int8_
from ...core.mixed_depth import check_depth_options
from ...checkpoints import mismatch_summary
from .dictionaries import DICTIONARY_FINGERPRINTS, check_dictionaries
from .hydra_config import namespace_from_config
from .layers import SReTDecoderLayer, SReTEncoderLayer
from .options import SReTOptions, sret_base_architecture
from .spec import check_model_options, read_side_spec
from .trained_depth import (SIDES, recursions_of_checkpoint, upgrade_depth_options, upgrade_listed_depth_override,
                            warn_untrained_depth)

logger = logging.getLogger(__name__)


class SReTTransformerEncoder(TransformerEncoderBase):
    """fairseq's encoder (embeddings, positions, final norm) with ``side.layers`` SReT
    layers, each built from ``side.layer``."""

    def __init__(self, cfg, side: SideSpec, dictionary, embed_tokens):
        # read by build_encoder_layer, which fairseq's constructor calls once per layer (a
        # plain value may be set before nn.Module's own __init__)
        self.side_spec = side
        super().__init__(cfg, dictionary, embed_tokens)

    def build_encoder_layer(self, cfg):
        return SReTEncoderLayer(self.side_spec.layer)

    def build_layers(self, side: SideSpec) -> None:
        """Replace the layers by freshly built ones of ``side``'s spec (before loading weights)."""
        self.side_spec = side
        self.layers = nn.ModuleList(self.build_encoder_layer(self.cfg) for _ in range(side.layers))


class SReTTransformerDecoder(TransformerDecoderBase):
    """fairseq's decoder (embeddings, positions, output projection) with ``side.layers`` SReT
    layers, each built from ``side.layer``."""

    def __init__(self, cfg, side: SideSpec, dictionary, embed_tokens, no_encoder_attn=False):
        self.side_spec = side  # read by build_decoder_layer (see SReTTransformerEncoder)
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return SReTDecoderLayer(self.side_spec.layer)

    def build_layers(self, side: SideSpec) -> None:
        """Replace the layers by freshly built ones of ``side``'s spec (before loading weights)."""
        self.side_spec = side
        self.layers = nn.ModuleList(self.build_decoder_layer(self.cfg) for _ in range(side.layers))


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

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", **kwargs):
        """fairseq's hub loading (:meth:`fairseq.models.BaseFairseqModel.from_pretrained`), returning
        :class:`SReTHubInterface`, which checks the search it is asked for."""
        from fairseq import hub_utils

        loaded = hub_utils.from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path,
                                           archive_map=cls.hub_models(), **kwargs)
        return SReTHubInterface(loaded["args"], loaded["task"], loaded["models"])

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
        positions, every inherited option) after the SReT defaults and the checks of the options
        that are not one side's layers; each side's options are read into its spec once, by
        :meth:`build_encoder` and :meth:`build_decoder`, which fairseq calls."""
        hydra = OmegaConf.is_config(args)  # fairseq-hydra-train's `model:` section, or its checkpoint
        if hydra:
            args = namespace_from_config(cls, args, task)
        sret_base_architecture(args)
        upgrade_depth_options(args, depth_overridable=not hydra)
        upgrade_listed_depth_override(args)
        check_model_options(args)
        check_dictionaries(args, task)
        model = super().build_model(args, task)
        # the mixed-depth criterion's options, given on the same command line: checked before
        # training starts (the criterion itself sees the model only at the first step)
        check_depth_options(getattr(args, "mixed_depth", None), getattr(args, "depth_warmup", None),
                            (args.encoder_recursions, args.decoder_recursions))
        warn_untrained_depth(args)
        return model

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(cfg)
        return SReTTransformerEncoder(cfg, read_side_spec(cfg, "encoder"), src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        cfg = TransformerConfig.from_namespace(cfg)
        return SReTTransformerDecoder(cfg, read_side_spec(cfg, "decoder"), tgt_dict, embed_tokens,
                                      no_encoder_attn=cfg.no_cross_attention)

    # ------------------------------------------------------------ depth on demand
    # model.recursions and model.depth are (encoder, decoder); model.set_depth(1, 2) and
    # ``with model.at_depth(1, 2):`` choose both (None: every trained application)
    depth_sides = ("encoder", "decoder")

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's strict load, after building the layers with the recursions the checkpoint
        holds where ``--{side}-recursions`` asked for fewer (:meth:`_build_checkpoint_recursions`);
        weights that do not fit (an override such as ``encoder_layers`` or a width, which a
        trained model cannot take) fail with one line that counts and names the mismatches."""
        self._build_checkpoint_recursions(state_dict)
        try:
            return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        except RuntimeError as exc:
            if "Error(s) in loading state_dict" not in str(exc):
                raise
            raise ValueError(weights_mismatch(str(exc))) from None

    def _build_checkpoint_recursions(self, state_dict) -> None:
        """The recursions the checkpoint was built with (:func:`recursions_of_checkpoint`) against
        those ``--{side}-recursions`` built: more fail, naming both; fewer (``--model-overrides
        "{'encoder_recursions': 1}"``, the older way to say ``--encoder-depth``) run that depth,
        with one warning, after building the side's layers again with the checkpoint's count."""
        rebuilt = False
        for side in SIDES:
            stack = getattr(self, side)
            saved, built = recursions_of_checkpoint(state_dict, side), stack.side_spec.recursions
            if saved is not None and saved < built:
                raise ValueError(
                    f"--{side}-recursions={built} is larger than the {saved} recursions this model was trained with;"
                    f" a trained model runs at depth 1 to {saved}, e.g. --model-overrides \"{{'{side}_depth': {saved}}}\"")
            if saved is None or saved == built or getattr(self.args, f"{side}_depth", None) is not None:
                continue
            logger.warning(f"--{side}-recursions {built} is fewer than the {saved} recursions this checkpoint was built"
                           f" with: running depth {built} of {saved}; say it with --{side}-depth (--model-overrides"
                           f" \"{{'{side}_depth': {built}}}\")")
            setattr(self.args, f"{side}_recursions", saved)
            setattr(self.args, f"{side}_depth", built)
            stack.build_layers(read_side_spec(self.args, side))
            rebuilt = True
        if rebuilt:
            warn_untrained_depth(self.args)

    # ------------------------------------------------------------ the dictionaries of the weights
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """The weights, and beside them (in the state dict's metadata, kept by torch.save) the
        recursions the layers were built with (read by :meth:`_build_checkpoint_recursions`) and the
        fingerprints of the dictionaries they were trained with: a training resumed or
        fine-tuned on another data-bin is refused when it loads them, as generation is when
        it builds the model (:func:`check_dictionaries`)."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        metadata = getattr(destination, "_metadata", None)
        if metadata is not None:
            metadata.setdefault(prefix[:-1], {}).update(
                {key: getattr(self.args, key) for key in DICTIONARY_FINGERPRINTS if getattr(self.args, key, None)})
            # and the recursions the layers were built with, which a depth override cannot change
            metadata[prefix[:-1]].update({f"{side}_recursions": getattr(self, side).side_spec.recursions
                                          for side in SIDES})

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        recorded = Namespace(**{key: local_metadata[key] for key in DICTIONARY_FINGERPRINTS if key in local_metadata})
        check_dictionaries(recorded, SimpleNamespace(source_dictionary=self.encoder.dictionary,
                                                     target_dictionary=self.decoder.dictionary))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)

    # ------------------------------------------------------------ generation
    def prepare_for_inference_(self, cfg):
        """fairseq's preparation, after refusing the generation options this model cannot
        honour (:data:`UNSUPPORTED_GENERATION`), by name; then, with the model option
        ``int8_in_generation``, the linear layers quantized to int8 (:mod:`~fairseq_sret.core.int8`)."""
        generation = getattr(cfg, "generation", None)
        for name, (default, why) in UNSUPPORTED_GENERATION.items():
            value = getattr(generation, name, default)
            if value not in (default, None, False):
                given = "" if value is True else f" {value}"
                raise ValueError(f"--{name.replace('_', '-')}{given}: {why}")
        int8 = getattr(self.args, "int8_in_generation", False)
        if int8:
            check_int8_generation(cfg)
        super().prepare_for_inference_(cfg)
        if int8:
            quantize_int8_(self)

    def make_generation_fast_(self, **kwargs):
        """fairseq's preparation for generation, after which the model cannot train, with the
        LRC coefficients folded into the neighbouring weights (:func:`~fairseq_sret.core.fold_lrc`;
        not with ``--keep-lrc-in-generation``): the same function up to float rounding, and
        every residual one element-wise operation per decoding step instead of two, as in
        fairseq's transformer. Folded in the dtype the weights have then (fairseq-generate casts
        to fp16 before; the CPU ``--bf16`` cast comes after)."""
        if not self._is_generation_fast and not getattr(self.args, "keep_lrc_in_generation", False):
            fold_lrc(self, inplace=True)
        super().make_generation_fast_(**kwargs)

    def lrc_coefficients(self) -> Dict[str, float]:
        """Every LRC coefficient by parameter name (for plots and logs)."""
        return {
            name: float(p.detach())
            for name, p in self.named_parameters()
            if name.endswith(("skip_scale", "branch_scale"))
        }


class SReTHubInterface(GeneratorHubInterface):
    """fairseq's hub interface (``translate``, ``sample``, ``generate``) refusing a beam that is
    not an integer >= 1, which fairseq would pass to its search unchecked."""

    def generate(self, tokenized_sentences, beam=5, *args, **kwargs):
        if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
            raise ValueError(f"beam must be an integer >= 1 (1: greedy), got {beam!r}")
        return super().generate(tokenized_sentences, beam, *args, **kwargs)


#: generation options (fairseq's GenerationConfig) that sret_transformer refuses: (default, why)
UNSUPPORTED_GENERATION = {
    **{name: (None, "sret_transformer does not compute attention weights (its attention runs fused), which"
                    f" alignments are read from: drop --{name.replace('_', '-')}")
       for name in ("print_alignment", "replace_unk")},
    **{name: (default, "an option of fairseq's non-autoregressive models (--task translation_lev); sret_transformer"
                       " decodes left to right: drop it")
       for name, default in (("iter_decode_eos_penalty", 0.0), ("iter_decode_max_iter", 10),
                             ("iter_decode_force_max_iter", False), ("iter_decode_with_beam", 1),
                             ("iter_decode_with_external_reranker", False), ("retain_iter_history", False),
                             ("decoding_format", None), ("print_step", False))},
    **{name: (default, "an option of fairseq's speech-to-speech translation (its second decoder); sret_transformer"
                       " has one decoder: drop it")
       for name, default in (("beam_mt", 0), ("max_len_a_mt", 0), ("max_len_b_mt", 200), ("lenpen_mt", 1))},
}


def check_int8_generation(cfg) -> None:
    """``int8_in_generation`` quantizes an fp32 model: refuse the casts that would come first."""
    common = getattr(cfg, "common", None)
    for flag in ("fp16", "bf16"):
        if getattr(common, flag, False):
            raise ValueError(f"--model-overrides int8_in_generation quantizes the fp32 model (int8 weights,"
                             f" fp32 activations quantized per token): drop --{flag}")


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
    return ("the checkpoint's weights do not fit the model its configuration (with any --model-overrides) builds: "
            + (mismatch_summary(missing, unexpected, shapes) or torch_message.splitlines()[0])
            + ". Overrides may change the depth (encoder_recursions, decoder_recursions) and options that keep"
              " the weights' shapes, not layer counts or widths")
