"""fairseq's layer interface over one recursive SReT block (:mod:`fairseq_sret.core`).

Each fairseq "layer" here is one *unique* layer applied ``recursions`` times (weights
shared), with a non-shared NLL after every application (paper Eq. 6), LRC on every residual
(Eq. 7-8) and sliced group self-attention (Sec. 4). fairseq passes (T, B, C) tensors; the
core modules take (B, T, C).
"""

from typing import Dict, List, Optional

from fairseq.incremental_decoding_utils import with_incremental_state
from torch import Tensor, nn

from ...core import BlockCache, SReTLayerSpec
from .trained_depth import check_checkpoint_recursions


class SReTEncoderLayer(nn.Module):
    """One unique encoder layer applied ``recursions`` times; fairseq's layer interface."""

    def __init__(self, spec: SReTLayerSpec):
        super().__init__()
        self.recursive = spec.build()

    def forward(self, x: Tensor, encoder_padding_mask: Optional[Tensor], attn_mask=None) -> Tensor:
        """x: (T, B, C), encoder_padding_mask: (B, T) True at padding -> (T, B, C)"""
        if attn_mask is not None:
            raise NotImplementedError("sret_transformer encoder layers take no attn_mask")
        # (B, T, C) made contiguous once (free from the second layer on, whose input is the
        # transposed view of this output): a strided residual stream makes every LayerNorm
        # copy its input, and its gradients trip AOTAutograd's view replay under torch.compile
        x = x.transpose(0, 1).contiguous()
        return self.recursive(x, key_padding_mask=encoder_padding_mask).transpose(0, 1)

    def upgrade_state_dict_named(self, state_dict, name):
        check_checkpoint_recursions(state_dict, name, self.recursive.recursions, "encoder")
        return state_dict


@with_incremental_state
class SReTDecoderLayer(nn.Module):
    """One unique decoder layer applied ``recursions`` times.

    During incremental decoding every application keeps its own self-attention cache and
    all applications share one cache of the projected encoder output (computed once per
    unique layer), stored under this module's incremental-state key;
    ``reorder_incremental_state`` reorders each cache once.
    """

    def __init__(self, spec: SReTLayerSpec):
        super().__init__()
        self.recursive = spec.build()

    def _caches(self, incremental_state) -> Optional[List[BlockCache]]:
        if incremental_state is None:
            return None
        state = self.get_incremental_state(incremental_state, "recursions")
        if state is None:
            state = {"caches": self.recursive.new_caches()}
            self.set_incremental_state(incremental_state, "recursions", state)
        return state["caches"]

    def forward(
        self,
        x: Tensor,
        encoder_out: Optional[Tensor] = None,
        encoder_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        prev_self_attn_state=None,
        prev_attn_state=None,
        self_attn_mask: Optional[Tensor] = None,
        self_attn_padding_mask: Optional[Tensor] = None,
        need_attn: bool = False,
        need_head_weights: bool = False,
    ):
        """x: (T, B, C); encoder_out: (S, B, C). Returns (x, None, None) like fairseq's layer.

        Causality is built into the attention module, so ``self_attn_mask`` (fairseq's
        future mask) only signals a full (non-incremental) causal forward.
        """
        if incremental_state is None and self_attn_mask is None:
            raise NotImplementedError(
                "sret_transformer decoder layers are always causal (full_context_alignment is not supported)"
            )
        if prev_self_attn_state is not None or prev_attn_state is not None:
            raise NotImplementedError("prev_self_attn_state/prev_attn_state are not supported")
        memory = None if encoder_out is None else encoder_out.transpose(0, 1)
        out = self.recursive(
            x.transpose(0, 1).contiguous(),  # see SReTEncoderLayer.forward
            key_padding_mask=self_attn_padding_mask,
            memory=memory,
            memory_padding_mask=encoder_padding_mask,
            caches=self._caches(incremental_state),
        )
        # Attention weights are not materialised (fused attention); alignment is unsupported.
        return out.transpose(0, 1), None, None

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        state = self.get_incremental_state(incremental_state, "recursions")
        if state is not None:
            self.recursive.reorder_caches(state["caches"], new_order)

    def upgrade_state_dict_named(self, state_dict, name):
        check_checkpoint_recursions(state_dict, name, self.recursive.recursions, "decoder")
        return state_dict
