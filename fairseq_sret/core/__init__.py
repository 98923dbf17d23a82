"""Pure-PyTorch building blocks of the Sliced Recursive Transformer (no fairseq import).

- :class:`SlicedGroupAttention`: the default attention layer (NMT and vision);
  :func:`register_attention_layer` / :func:`attention_layer` (:mod:`.attention`): attention
  layers by name, what ``SReTLayerSpec(attention=...)`` builds blocks with.
- :class:`LearnableResidual`: LRC.
- :class:`NonLinearProjection`: NLL.
- :class:`SReTBlock`: the shared transformer layer.
- :class:`Recursive`: a shared layer applied N times with an NLL after each application.
- :class:`EncoderDecoderSpec` / :class:`SideSpec` / :class:`SReTLayerSpec`: a translation
  model's layers as typed values, built into :class:`Recursive` layers (what each NMT adapter
  reads its framework's configuration into, and what the vision models build their blocks
  with); :class:`RecursionSpec`: how any shared block is applied (the recursive MLP-Mixer's).
- :class:`RecursionSchedule`: what each application does (groups, partition, NLL, whether
  it runs), parsed and validated from user values in one place.
- :func:`set_depth` / :func:`at_depth` / :class:`DepthControl` (:mod:`.depth`): run every
  recursive layer of a model at a chosen depth; :func:`check_depth`: the one depth check.
- :func:`parse_mixed_depth` / :func:`mixed_depth_loss` (:mod:`.mixed_depth`): mixed-depth
  training.
- :func:`compile_shared_layers` (:mod:`.regional_compile`): ``torch.compile`` of each shared
  layer alone, reused by its applications and every depth.
- :func:`fold_lrc`: an inference copy with the LRC coefficients folded into weights.
- :func:`lrc_add` / :func:`lrc_add_norm` (:mod:`.fused`): residual + LRC (+ LayerNorm) as one
  operation, a Triton kernel on CUDA.
- :class:`BlockCache` / :class:`AttentionCache` / :class:`KeyValues` (:mod:`.cache`): the
  incremental-decoding state, per recursion of each shared layer, that fairseq's incremental
  state and transformers' ``Cache`` both hold; :func:`block_caches`: its layout (one
  self-attention cache per recursion, one shared cross-attention cache).
- :func:`fast_paths` / :func:`apply_fast_paths` (:mod:`.config`): the switches of the fast
  paths, process-wide / for one built model.
"""

from .attention import ATTENTION_LAYERS, SlicedGroupAttention, attention_layer, register_attention_layer
from .cache import AttentionCache, BlockCache, KeyValues, block_caches
from .block import SReTBlock
from .config import apply_fast_paths, fast_paths
from .depth import DepthControl, at_depth, set_depth
from .drop_path import DropPath
from .feedforward import FeedForward, NonLinearProjection, get_activation
from .fold import fold_lrc
from .fused import lrc_add, lrc_add_norm
from .layer_spec import EncoderDecoderSpec, RecursionSpec, SideSpec, SReTLayerSpec
from .mixed_depth import (
    DepthTerm, DepthWarmup, check_mixed_depth, mixed_depth_loss, parse_depth_warmup, parse_mixed_depth,
)
from .partition import PARTITION_MODES, compute_partition
from .recursion import Recursive
from .regional_compile import compile_shared_layers
from .residual import FoldedResidual, LearnableResidual
from .schedule import RecursionSchedule, RecursionStep, check_depth

__all__ = [
    "ATTENTION_LAYERS",
    "AttentionCache",
    "BlockCache",
    "DepthControl",
    "DepthTerm",
    "DepthWarmup",
    "DropPath",
    "EncoderDecoderSpec",
    "FeedForward",
    "FoldedResidual",
    "KeyValues",
    "LearnableResidual",
    "NonLinearProjection",
    "PARTITION_MODES",
    "RecursionSchedule",
    "RecursionSpec",
    "RecursionStep",
    "Recursive",
    "SReTBlock",
    "SReTLayerSpec",
    "SideSpec",
    "SlicedGroupAttention",
    "apply_fast_paths",
    "at_depth",
    "attention_layer",
    "block_caches",
    "check_depth",
    "check_mixed_depth",
    "compile_shared_layers",
    "compute_partition",
    "fast_paths",
    "fold_lrc",
    "get_activation",
    "lrc_add",
    "lrc_add_norm",
    "mixed_depth_loss",
    "parse_depth_warmup",
    "parse_mixed_depth",
    "register_attention_layer",
    "set_depth",
]
