"""SReT translation models as transformers encoder-decoders, built from :mod:`fairseq_sret.core`.

The layers are the core's: each unique layer is one :class:`~fairseq_sret.core.SReTBlock`
applied ``recursions`` times by :class:`~fairseq_sret.core.Recursive`, with its NLLs, LRC and
sliced group self-attention (paper Eq. 6-8, Sec. 4). Around them sit the parts of fairseq's
transformer that a trained model needs, computed as fairseq computes them: scaled token
embeddings, fairseq's position numbering (sinusoidal or learned), the optional embedding
LayerNorm, the final LayerNorms of pre-LN stacks and the output projection, tied to the
embeddings as trained. Teacher-forced logits equal fairseq's.

Incremental decoding goes through transformers' cache API with
:class:`~fairseq_sret.hf.cache.SReTCache`. The parts live beside this module: :mod:`.positions`,
:mod:`.cache`, :mod:`.stacks` (encoder and decoder) and :mod:`.generation` (generate()'s checks
and fairseq's length limit).
"""

import os
import sys
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, LogitsProcessorList, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput
from transformers.utils import logging

from ..core import LearnableResidual
from ..core.depth import DepthControl, recursions_of, set_depth
from ..core.mixed_depth import untrained_depth_warning
from .cache import SReTCache
from .configuration import SIDES, SReTConfig
from .generation import EndAtLengthLimit, check_generation_values
from .positions import PositionalEmbedding, sinusoidal_table
from .stacks import SReTDecoder, SReTEncoder
from .tokenization import VOCAB_FILES_NAMES, check_tokenizer_files

logger = logging.get_logger(__name__)


class SReTPreTrainedModel(PreTrainedModel):
    config_class = SReTConfig
    config: SReTConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _no_split_modules = ["Recursive"]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' loading, then, for a folder, the check that its tokenizer files are the
        ones it was exported with (:func:`check_exported_files`)."""
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        folder = os.path.normpath(os.path.join(str(pretrained_model_name_or_path), kwargs.get("subfolder") or ""))
        if os.path.isdir(folder) and not _loaded_by_a_pipeline():
            check_exported_files(folder, model.config)
        return model

    def _init_weights(self, module: nn.Module) -> None:
        """fairseq's initialisation for what a checkpoint does not hold: computed position
        tables always, and the weights of a freshly made (untrained) model."""
        if isinstance(module, PositionalEmbedding):
            if module.learned:
                init.normal_(module.weight, std=module.dim**-0.5)
            else:
                init.copy_(module.table, sinusoidal_table(module.table.size(0), module.dim, module.padding_idx))
        elif isinstance(module, LearnableResidual) and module.learnable:
            init.ones_(module.skip_scale)
            init.ones_(module.branch_scale)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, std=module.embedding_dim**-0.5)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


def _loaded_by_a_pipeline() -> bool:
    """Whether transformers' pipeline loader is loading the model: it turns every error into a
    multi-line report of its tries, so there the pipeline checks the folder itself
    (:class:`~fairseq_sret.hf.pipeline.SReTTranslationPipeline`), once the model is loaded."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "load_model" and frame.f_globals.get("__name__") == "transformers.pipelines.base":
            return True
        frame = frame.f_back
    return False


#: what sret-export-hf writes into every folder it makes (fairseq_sret.hf.convert.MARKER)
EXPORT_MARKER = "sret_export.json"


def check_exported_files(folder, config: SReTConfig) -> None:
    """Refuse a model folder whose tokenizer files are not those recorded in its configuration at
    export (a replaced ``spm.model``, a dictionary with lines swapped), naming the file; the files
    the folder lacks are the tokenizer's to name. A folder of sret-export-hf made before the
    fingerprints were recorded loads as before, with one warning that it cannot be checked."""
    recorded = config.tokenizer_fingerprints
    if recorded is None:
        if os.path.isfile(os.path.join(folder, EXPORT_MARKER)):
            logger.warning_once(f"{folder}: exported before sret-export-hf recorded the fingerprints of its tokenizer"
                                " files, which therefore cannot be checked; export it again to record them")
        return
    present = {name: os.path.join(folder, name) for name in VOCAB_FILES_NAMES.values()
               if os.path.isfile(os.path.join(folder, name))}
    check_tokenizer_files(present, {name: value for name, value in recorded.items() if name in present})


class _DepthOnDemand(DepthControl):
    """Depth on demand for the transformers models (:class:`~fairseq_sret.core.DepthControl`):
    ``set_depth`` / ``at_depth`` / ``depth`` / ``recursions`` per side, the depth kept in the
    configuration (``encoder_depth``, ``decoder_depth``) so that ``save_pretrained`` keeps it,
    and the warning of the fairseq path for a depth the model was not trained at."""

    depth_sides = SIDES

    def _apply_configured_depth(self) -> None:
        """The depths of the configuration (checked by the core's one depth check, naming the field)."""
        for side in SIDES:
            value = getattr(self.config, f"{side}_depth")
            module = getattr(self, side)
            built = recursions_of(module)
            set_depth(module, value, name=f"{side}_depth")
            setattr(self.config, f"{side}_depth", None if value in (None, built) else value)
        self.warn_untrained_depth()

    def set_depth(self, *depths: Optional[int], **by_side: Optional[int]) -> None:
        super().set_depth(*depths, **by_side)
        for side, depth, built in zip(SIDES, self.depth, self.recursions):
            setattr(self.config, f"{side}_depth", None if depth == built else depth)
        self.warn_untrained_depth()

    def warn_untrained_depth(self) -> None:
        """Log fairseq's warning when the model runs at depths its training did not include
        (:func:`fairseq_sret.core.mixed_depth.untrained_depth_warning`); silent when the
        configuration does not record the training criterion (``mixed_depth`` None)."""
        if self.config.mixed_depth is None:
            return
        message = untrained_depth_warning(self.depth, self.recursions, self.config.mixed_depth)
        if message is not None:
            logger.warning(message)


class SReTModel(_DepthOnDemand, SReTPreTrainedModel):
    """The encoder and the decoder (features before the output projection)."""

    def __init__(self, config: SReTConfig):
        super().__init__(config)
        dim = config.encoder_embed_dim
        source = nn.Embedding(config.vocab_size, dim, config.pad_token_id)
        target = source if config.share_all_embeddings else nn.Embedding(config.decoder_vocab_size, dim, config.pad_token_id)
        self.encoder = SReTEncoder(config, source)
        self.decoder = SReTDecoder(config, target)
        if config.share_all_embeddings:
            self._tied_weights_keys = {"encoder.embed_tokens.weight": "decoder.embed_tokens.weight"}
        self.post_init()
        self._apply_configured_depth()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.encoder.embed_tokens = value
        if self.config.share_all_embeddings:
            self.decoder.embed_tokens = value

    def forward(
        self,
        input_ids: Optional[Tensor] = None,
        attention_mask: Optional[Tensor] = None,
        decoder_input_ids: Optional[Tensor] = None,
        encoder_outputs=None,
        cache: Optional[Cache] = None,
        use_cache: Optional[bool] = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        """input_ids: (B, S) source ids (right- or left-padded, ``attention_mask`` 0 at padding);
        decoder_input_ids: (B, T), starting with ``decoder_start_token_id`` (fairseq's eos);
        ``cache``: an :class:`SReTCache` for incremental decoding (generate() passes one).
        Returns the decoder features (B, T, decoder_output_dim)."""
        if encoder_outputs is None:
            if input_ids is None:
                raise ValueError("give input_ids (the source) or encoder_outputs")
            encoder_outputs = self.encoder(input_ids, attention_mask=attention_mask)
        elif isinstance(encoder_outputs, (tuple, list)):
            encoder_outputs = BaseModelOutput(last_hidden_state=encoder_outputs[0])
        memory = encoder_outputs.last_hidden_state
        if decoder_input_ids is None:
            raise ValueError("give decoder_input_ids (or labels to SReTForConditionalGeneration)")
        mask = padding_to_mask(input_ids, attention_mask, self.config)
        # fairseq hands the cross-attention a padding mask even when nothing is padded
        memory_padding = mask.eq(0) if mask is not None else memory.new_zeros(memory.shape[:2], dtype=torch.bool)
        if use_cache is False:
            cache = None
        features = self.decoder(decoder_input_ids, memory, memory_padding, cache=cache)
        return Seq2SeqModelOutput(last_hidden_state=features, cache=cache, encoder_last_hidden_state=memory)


def padding_to_mask(input_ids: Optional[Tensor], attention_mask: Optional[Tensor], config: SReTConfig) -> Optional[Tensor]:
    """The source's attention mask (1 at tokens, 0 at padding): ``attention_mask`` as given,
    else from the padding id in ``input_ids`` (as fairseq finds padding), else None."""
    if attention_mask is not None:
        return attention_mask
    if input_ids is None:
        return None
    return input_ids.ne(config.pad_token_id).long()


class SReTForConditionalGeneration(_DepthOnDemand, SReTPreTrainedModel, GenerationMixin):
    """An SReT translation model for transformers: :meth:`forward` (teacher forcing, with a
    loss when given ``labels``) and ``generate()`` (greedy or beam search with an
    :class:`SReTCache`), at full depth or at a depth chosen at load time
    (``from_pretrained(dir, encoder_depth=1)``), with :meth:`set_depth` or per call
    (``generate(..., encoder_depth=1, decoder_depth=1)``)."""

    def __init__(self, config: SReTConfig):
        super().__init__(config)
        self.model = SReTModel(config)
        self.lm_head = nn.Linear(config.decoder_output_dim, config.decoder_vocab_size, bias=False)
        tied = {}
        if config.share_decoder_input_output_embed:
            tied["lm_head.weight"] = "model.decoder.embed_tokens.weight"
        if config.share_all_embeddings:
            tied["model.encoder.embed_tokens.weight"] = "model.decoder.embed_tokens.weight"
        self._tied_weights_keys = tied or None
        self.post_init()

    # the sides whose depth is chosen (DepthControl) and what generate() calls the encoder
    @property
    def encoder(self) -> SReTEncoder:
        return self.model.encoder

    @property
    def decoder(self) -> SReTDecoder:
        return self.model.decoder

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(
        self, input_ids: Optional[Tensor] = None, decoder_input_ids: Optional[Tensor] = None,
        labels: Optional[Tensor] = None, **kwargs,
    ) -> Seq2SeqLMOutput:
        """:meth:`SReTModel.forward` (the other arguments: ``attention_mask``, ``encoder_outputs``,
        ``cache``, ``use_cache``), returning logits (B, T, target vocabulary) in float32;
        ``labels`` (B, T) (-100 or padding ignored) give the cross-entropy ``loss`` and, without
        ``decoder_input_ids``, the decoder inputs (shifted right behind the start token)."""
        if labels is not None:
            kwargs["cache"] = None
            if decoder_input_ids is None:
                decoder_input_ids = shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)
        outputs = self.model(input_ids, decoder_input_ids=decoder_input_ids, **kwargs)
        logits = self.lm_head(outputs.last_hidden_state).float()
        loss = None
        if labels is not None:
            targets = labels.masked_fill(labels.eq(self.config.pad_token_id), -100)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-100)
        return Seq2SeqLMOutput(
            loss=loss, logits=logits, cache=outputs.cache, encoder_last_hidden_state=outputs.encoder_last_hidden_state,
        )

    def generate(self, *args, encoder_depth: Optional[int] = None, decoder_depth: Optional[int] = None, **kwargs):
        """transformers' ``generate()`` with an :class:`SReTCache` (unless ``cache`` is given or
        ``use_cache=False``), ending hypotheses at the length limit as fairseq does
        (:class:`EndAtLengthLimit`, unless ``forced_eos_token_id`` asks for transformers' own
        rule), at the given depths for this call (None: the model's current depth), checked
        and warned about as :meth:`set_depth` does. The search's numbers are checked first
        (:func:`check_generation_values`)."""
        check_generation_values(kwargs, kwargs.get("generation_config") or self.generation_config)
        if "cache" not in kwargs and kwargs.get("use_cache", True) is not False:
            kwargs["cache"] = SReTCache()
        config = kwargs.get("generation_config") or self.generation_config
        eos = kwargs.get("eos_token_id", config.eos_token_id)
        # transformers' precedence: max_new_tokens (given or configured), else max_length; neither:
        # transformers' own default length, without fairseq's end at it
        max_new_tokens = kwargs.get("max_new_tokens", config.max_new_tokens)
        max_length = kwargs.get("max_length", config.max_length)
        if (isinstance(eos, int) and kwargs.get("forced_eos_token_id", config.forced_eos_token_id) is None
                and (max_new_tokens, max_length) != (None, None)):
            limit = EndAtLengthLimit(eos, max_new_tokens, max_length)
            kwargs["logits_processor"] = LogitsProcessorList([*(kwargs.get("logits_processor") or []), limit])
        chosen = {side: value for side, value in zip(SIDES, (encoder_depth, decoder_depth)) if value is not None}
        if not chosen:
            return super().generate(*args, **kwargs)
        with self.at_depth(**{**dict(zip(SIDES, self.depth)), **chosen}):
            self.warn_untrained_depth()
            return super().generate(*args, **kwargs)

    def prepare_decoder_input_ids_from_labels(self, labels: Tensor) -> Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

def shift_tokens_right(labels: Tensor, pad_token_id: int, start_token_id: int) -> Tensor:
    """fairseq's ``prev_output_tokens``: the start token (eos), then the labels without their
    last position; -100 (ignored labels) becomes padding. (B, T) -> (B, T)"""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = start_token_id
    return shifted.masked_fill(shifted.eq(-100), pad_token_id)
