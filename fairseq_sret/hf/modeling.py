"""SReT translation models as transformers encoder-decoders, built from :mod:`fairseq_sret.core`.

The layers are the core's: each unique layer is one :class:`~fairseq_sret.core.SReTBlock`
applied ``recursions`` times by :class:`~fairseq_sret.core.Recursive`, with its NLLs, LRC and
sliced group self-attention (paper Eq. 6-8, Sec. 4). Around them sit the parts of fairseq's
transformer that a trained model needs, computed as fairseq computes them: scaled token
embeddings, fairseq's position numbering (sinusoidal or learned), the optional embedding
LayerNorm, the final LayerNorms of pre-LN stacks and the output projection, tied to the
embeddings as trained. Teacher-forced logits equal fairseq's.

Incremental decoding goes through transformers' cache API with :class:`SReTCache`.
"""

import math
import os
import sys
from numbers import Integral, Real
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, LogitsProcessor, LogitsProcessorList, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput
from transformers.utils import logging

from ..core import AttentionCache, BlockCache, LearnableResidual
from ..core.depth import DepthControl, recursions_of, set_depth
from ..core.mixed_depth import untrained_depth_warning
from .configuration import SIDES, SReTConfig, read_side_spec
from .tokenization import VOCAB_FILES_NAMES, check_tokenizer_files

logger = logging.get_logger(__name__)


# ---------------------------------------------------------------- positions
def sinusoidal_table(rows: int, dim: int, padding_idx: int) -> Tensor:
    """fairseq's sinusoidal positions (tensor2tensor's layout: the sines of all frequencies, then
    the cosines), one row per position number; the row ``padding_idx`` (the number of padding
    tokens) is zero. (rows, dim), float32."""
    half = dim // 2
    log_step = math.log(10000) / (half - 1)
    frequencies = torch.exp(torch.arange(half, dtype=torch.float) * -log_step)
    angles = torch.arange(rows, dtype=torch.float).unsqueeze(1) * frequencies.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).view(rows, -1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    table[padding_idx] = 0
    return table


def position_numbers(padding: Tensor, padding_idx: int) -> Tensor:
    """fairseq's position numbers: the i-th real token (1-based) of a row is at ``padding_idx + i``,
    padding at ``padding_idx``, whichever side the padding is on. padding: (B, T) bool -> (B, T) long."""
    real = (~padding).long()
    return torch.cumsum(real, dim=1) * real + padding_idx


class PositionalEmbedding(nn.Module):
    """Embeddings of fairseq's position numbers (:func:`position_numbers`), a table of
    ``max_positions + padding_idx + 1`` rows: learned (``weight``, saved) or sinusoidal
    (``table``, computed, never saved; grown like fairseq's for longer inputs)."""

    def __init__(self, max_positions: int, dim: int, padding_idx: int, learned: bool):
        super().__init__()
        self.dim, self.padding_idx, self.learned = dim, padding_idx, learned
        rows = max_positions + padding_idx + 1
        if learned:
            self.weight = nn.Parameter(torch.empty(rows, dim))
            nn.init.normal_(self.weight, std=dim**-0.5)
            with torch.no_grad():
                self.weight[padding_idx].zero_()
        else:
            self.register_buffer("table", sinusoidal_table(rows, dim, padding_idx), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        """positions: (B, T) long -> (B, T, dim)"""
        if self.learned:
            return F.embedding(positions, self.weight, self.padding_idx)
        needed = int(positions.max()) + 1
        if needed > self.table.size(0):
            self.table = sinusoidal_table(needed, self.dim, self.padding_idx).to(self.table)
        return self.table.index_select(0, positions.reshape(-1)).view(*positions.shape, -1)


# ---------------------------------------------------------------- cache
def cache_layer(cache: Cache, index: int):
    """Layer ``index`` of a transformers :class:`~transformers.cache_utils.Cache`, added as
    needed: the key/value store of one core :class:`~fairseq_sret.core.AttentionCache` (its
    ``update``, ``keys`` and ``values`` are the core's :class:`~fairseq_sret.core.KeyValues`'),
    which the ``Cache`` thereby counts, reorders and crops."""
    layers = cache.layers
    if index >= len(layers):
        if cache.layer_class_to_replicate is None:
            raise ValueError(
                f"this {type(cache).__name__} holds {len(layers)} layers, SReT decoding needs layer {index}"
                " (one self-attention cache per recursion of every shared layer): pass cache=SReTCache()"
                " (fairseq_sret.hf) or none (generate() makes one)"
            )
        while len(layers) <= index:
            layers.append(cache.layer_class_to_replicate())
    return layers[index]


class SReTCache(EncoderDecoderCache):
    """transformers' encoder-decoder cache laid out for SReT decoders of ``R`` recursions:

    - self-attention layer ``i * R + r`` holds application ``r`` of shared decoder layer ``i``:
      one cache per recursion, so the shared module never overwrites its own keys and values;
    - cross-attention layer ``i`` holds the encoder output's keys and values of shared layer
      ``i``, computed by its first application and read by all of them (the same weights read
      the same memory);
    - beam search reorders only the self-attention caches: the encoder keys and values of the
      hypotheses of one sentence are equal rows, so a same-size reordering (which keeps every
      hypothesis with its sentence, as generate()'s beam search does) leaves them alone, as
      fairseq's encoder-decoder attention and :meth:`fairseq_sret.core.AttentionCache.reorder` do; they
      are selected only when the batch changes size.
    """

    def __init__(self):
        super().__init__(DynamicCache(), DynamicCache())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.self_attention_cache.reorder_cache(beam_idx)
        layers = [layer for layer in self.cross_attention_cache.layers if layer.get_seq_length() > 0]
        if layers and layers[0].keys.size(0) != beam_idx.numel():
            self.cross_attention_cache.reorder_cache(beam_idx)


# ---------------------------------------------------------------- encoder / decoder
class _Stack(nn.Module):
    """What fairseq's encoder and decoder share: token embeddings (scaled by sqrt(C) unless
    ``no_scale_embedding``), positions, the embedding LayerNorm, dropout and the unique layers."""

    def __init__(self, config: SReTConfig, side: str, embed_tokens: nn.Embedding):
        super().__init__()
        dim = getattr(config, f"{side}_embed_dim")
        self.padding_idx = config.pad_token_id
        self.embed_tokens = embed_tokens
        self.embed_scale = 1.0 if config.no_scale_embedding else math.sqrt(dim)
        self.embed_positions = None
        if not config.no_token_positional_embeddings:
            self.embed_positions = PositionalEmbedding(
                getattr(config, "max_source_positions" if side == "encoder" else "max_target_positions"), dim,
                self.padding_idx, learned=getattr(config, f"{side}_learned_pos"),
            )
        self.layernorm_embedding = nn.LayerNorm(dim) if config.layernorm_embedding else None
        self.dropout = nn.Dropout(config.dropout)
        self.layers = read_side_spec(config, side).build()

    def _check_runnable(self) -> None:
        """One line, not torch's mixed-dtype error from inside a LayerNorm, for weights in a
        precision the model does not run in on the CPU (``from_pretrained(dir, dtype=torch.float16)``)."""
        weight = self.embed_tokens.weight
        if weight.device.type == "cpu" and weight.dtype != torch.float32:
            raise ValueError(f"this SReT model holds {weight.dtype} weights on the CPU, where it runs in float32:"
                             " load it without dtype= (or dtype=torch.float32), or move it to a GPU")

    def _finish_embedding(self, x: Tensor, positions: Optional[Tensor]) -> Tensor:
        if positions is not None:
            x = x + self.embed_positions(positions)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout(x)


class SReTEncoder(_Stack):
    """The encoder: (B, S) token ids -> (B, S, C). Padding (either side) is where
    ``attention_mask`` is 0, or where the ids are the padding id."""

    main_input_name = "input_ids"

    def __init__(self, config: SReTConfig, embed_tokens: nn.Embedding):
        super().__init__(config, "encoder", embed_tokens)
        self.layer_norm = nn.LayerNorm(config.encoder_embed_dim) if config.encoder_normalize_before else None

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None, **kwargs) -> BaseModelOutput:
        self._check_runnable()
        padding = input_ids.eq(self.padding_idx) if attention_mask is None else attention_mask.eq(0)
        positions = None if self.embed_positions is None else position_numbers(padding, self.padding_idx)
        x = self._finish_embedding(self.embed_scale * self.embed_tokens(input_ids), positions)
        has_padding = bool(padding.any())
        if has_padding:  # fairseq zeroes the padded rows before the first layer
            x = x * (1 - padding.unsqueeze(-1).type_as(x))
        for layer in self.layers:
            x = layer(x, key_padding_mask=padding if has_padding else None)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return BaseModelOutput(last_hidden_state=x)


class SReTDecoder(_Stack):
    """The decoder's features: (B, T) token ids -> (B, T, decoder_output_dim), reading the
    encoder output (B, S, C) through every application's cross-attention.

    With ``cache`` (an :class:`~transformers.cache_utils.EncoderDecoderCache` laid out as
    :class:`SReTCache` describes) ``input_ids`` are the new steps after the cached ones, which
    are taken as unpadded."""

    def __init__(self, config: SReTConfig, embed_tokens: nn.Embedding):
        super().__init__(config, "decoder", embed_tokens)
        dim = config.decoder_embed_dim
        self.recursions = config.decoder_recursions
        self.layer_norm = None
        if config.decoder_normalize_before and not config.no_decoder_final_norm:
            self.layer_norm = nn.LayerNorm(dim)
        self.project_in_dim = None
        if embed_tokens.embedding_dim != dim:
            self.project_in_dim = nn.Linear(embed_tokens.embedding_dim, dim, bias=False)
        self.project_out_dim = None
        if config.decoder_output_dim != dim:
            self.project_out_dim = nn.Linear(dim, config.decoder_output_dim, bias=False)

    def _layer_caches(self, cache: EncoderDecoderCache, index: int) -> List[BlockCache]:
        """Shared layer ``index``'s core caches over ``cache``'s layers (see :class:`SReTCache`)."""
        cross = AttentionCache(cache_layer(cache.cross_attention_cache, index))
        return [
            BlockCache(AttentionCache(cache_layer(cache.self_attention_cache, index * self.recursions + r)), cross)
            for r in range(self.recursions)
        ]

    def forward(
        self, input_ids: Tensor, encoder_hidden_states: Tensor, encoder_padding_mask: Tensor,
        cache: Optional[EncoderDecoderCache] = None,
    ) -> Tensor:
        self._check_runnable()
        padding = input_ids.eq(self.padding_idx)
        has_padding = bool(padding.any())
        if cache is not None:
            if not isinstance(cache, EncoderDecoderCache):
                raise TypeError(f"SReT decoding needs an EncoderDecoderCache (SReTCache), got {type(cache).__name__}")
            # the steps are unpadded; a padding id here is what greedy search feeds a finished
            # hypothesis, whose outputs are not read (fairseq drops such rows instead)
            has_padding = False
            past = cache.get_seq_length()
            positions = torch.arange(input_ids.size(1), device=input_ids.device) + self.padding_idx + past + 1
            positions = positions.unsqueeze(0).expand_as(input_ids)
        else:
            positions = position_numbers(padding, self.padding_idx)
        if self.embed_positions is None:
            positions = None
        x = self.embed_scale * self.embed_tokens(input_ids)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        x = self._finish_embedding(x, positions)
        for index, layer in enumerate(self.layers):
            x = layer(
                x, key_padding_mask=padding if has_padding else None, memory=encoder_hidden_states,
                memory_padding_mask=encoder_padding_mask,
                caches=None if cache is None else self._layer_caches(cache, index),
            )
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x


# ---------------------------------------------------------------- models
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


#: generate()'s integer settings and the least value each takes
GENERATION_COUNTS = {"num_beams": 1, "num_return_sequences": 1, "max_new_tokens": 1, "max_length": 1,
                     "min_new_tokens": 0, "min_length": 0, "top_k": 0, "no_repeat_ngram_size": 0,
                     "encoder_no_repeat_ngram_size": 0, "num_beam_groups": 1}
#: generate()'s real settings: (least, whether the least is excluded, most or None)
GENERATION_NUMBERS = {"length_penalty": (-math.inf, True, None), "temperature": (0.0, True, None),
                      "top_p": (0.0, True, 1.0), "repetition_penalty": (0.0, True, None)}


def check_generation_values(kwargs: dict, config) -> None:
    """One line naming the setting, not an error from inside the search, for a generate() setting
    (given, or in the generation configuration) of the wrong type or out of range
    (``num_beams=0``, ``max_new_tokens=2.5``, ``length_penalty=nan``)."""
    for name, least in GENERATION_COUNTS.items():
        value = kwargs.get(name, getattr(config, name, None))
        if value is not None and (isinstance(value, bool) or not isinstance(value, Integral) or value < least):
            raise ValueError(f"generate(): {name} must be an integer >= {least}, got {value!r}")
    for name, (least, open_least, most) in GENERATION_NUMBERS.items():
        value = kwargs.get(name, getattr(config, name, None))
        if value is None:
            continue
        if (isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value)
                or value < least or (open_least and value == least) or (most is not None and value > most)):
            bounds = f" {'>' if open_least else '>='} {least}" if math.isfinite(least) else ""
            raise ValueError(f"generate(): {name} must be a finite number{bounds}{f' and <= {most}' if most else ''},"
                             f" got {value!r}")


def shift_tokens_right(labels: Tensor, pad_token_id: int, start_token_id: int) -> Tensor:
    """fairseq's ``prev_output_tokens``: the start token (eos), then the labels without their
    last position; -100 (ignored labels) becomes padding. (B, T) -> (B, T)"""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = start_token_id
    return shifted.masked_fill(shifted.eq(-100), pad_token_id)


class EndAtLengthLimit(LogitsProcessor):
    """fairseq's end of a hypothesis at the length limit: the last token the limit allows
    (``max_new_tokens``, else ``max_length`` counted with the decoder prompt) can only be ``</s>``,
    which keeps its log-probability (transformers' ``forced_eos_token_id`` sets it to 0, which
    changes the scores and the ranking of the hypotheses that reach the limit).

    One instance per ``generate()`` call: the first call sees the prompt and fixes the step."""

    def __init__(self, eos_token_id: int, max_new_tokens: Optional[int], max_length: Optional[int]):
        self.eos_token_id, self.max_new_tokens, self.max_length = eos_token_id, max_new_tokens, max_length
        self.last_length: Optional[int] = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.last_length is None:
            prompt = input_ids.shape[-1]
            self.last_length = prompt + self.max_new_tokens - 1 if self.max_new_tokens is not None else self.max_length - 1
        if input_ids.shape[-1] < self.last_length:
            return scores
        eos = scores[:, self.eos_token_id].clone()
        scores = torch.full_like(scores, -math.inf)
        scores[:, self.eos_token_id] = eos
        return scores
