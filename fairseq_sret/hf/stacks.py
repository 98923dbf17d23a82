"""The encoder and the decoder of the transformers port: what fairseq's encoder and decoder do
around the core's recursive layers (embeddings, positions, final LayerNorms), each unique
layer built from the configuration's spec (:func:`~fairseq_sret.hf.configuration.read_side_spec`)."""

import math
from typing import Optional

import torch
from torch import Tensor, nn
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from .cache import layer_caches
from .configuration import SReTConfig, read_side_spec
from .positions import PositionalEmbedding, position_numbers


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
    :class:`~fairseq_sret.hf.cache.SReTCache` describes) ``input_ids`` are the new steps after the cached ones, which
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
                caches=None if cache is None else layer_caches(cache, index, self.recursions),
            )
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x
