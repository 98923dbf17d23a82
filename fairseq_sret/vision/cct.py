"""Compact Convolutional Transformers (CCT; Hassani et al., "Escaping the Big Data Paradigm
with Compact Transformers", arXiv:2104.05704) and a recursive CCT in SReT's style.

CCT-L/KxN: a convolutional tokenizer of N blocks (KxK convolution without bias, ReLU, 3x3
max pooling of stride 2), a learned position embedding, L transformer layers, a final
LayerNorm, sequence pooling (an attention pooling over the tokens instead of a class token)
and a linear classifier. The layer normalises its stream between attention and MLP:

    x = x + DropPath(MHSA(LN_0(x)))
    x = LN_1(x)
    x = x + DropPath(MLP(x))

It is an :class:`~fairseq_sret.core.SReTBlock` with ``normalize_stream_before_ffn=True``
and no q/k/v bias, applied by a :class:`~fairseq_sret.core.Recursive`, so the same model
class is the plain CCT (``recursions=1, nll_ratio=0, lrc=False``) and the recursive one (each
unique layer applied ``recursions`` times, an NLL after each application, LRC on every
residual: the settings and names of :class:`~fairseq_sret.vision.SReT`).
"""

from dataclasses import dataclass, field, replace
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from ..core import RecursionSchedule, RecursionSpec, SReTLayerSpec
from ..core.attention import DEFAULT_ATTENTION_LAYER
from ..core.depth import DepthControl
from .conventions import (
    GLOBAL_POOLS, ClassifierConventions, build_on, check_attention_layer, check_nll_ratio, feature_take_indices,
    pool_features,
)
from .legacy import translate_nll
from .registry import CIFAR10_MEAN, CIFAR10_STD, image_cfg, register_model
from .sret.layers import _add_pos_embed, _pair, _prepare_input, _tokens_to_map
from .sret.model import PARTITION

Size = Union[int, Tuple[int, int]]

#: ``global_pool`` values: sequence pooling (the paper's), those of :data:`GLOBAL_POOLS`
CCT_POOLS = ("seq",) + GLOBAL_POOLS


@dataclass
class CCTConfig:
    embed_dim: int = field(default=128, metadata={"help": "token width"})
    num_heads: int = field(default=2, metadata={"help": "attention heads"})
    layers: int = field(default=2, metadata={"help": "unique (shared) transformer layers"})
    mlp_ratio: float = field(default=1.0, metadata={"help": "MLP hidden width / embed_dim"})
    recursions: int = field(
        default=1, metadata={"help": "applications each layer is built (and trained) with; set_depth chooses"
                                     " how many of them run"},
    )
    groups: Tuple[int, ...] = field(
        default=(1,), metadata={"help": "attention groups per recursion (1: global); the last entry repeats;"
                                        " SReT's per-stage form of one stage, ((4, 1),), is the same"},
    )
    partition: Optional[Tuple[str, ...]] = field(
        default=None, metadata={"help": "token partition per recursion (see core.partition); None: SReT's,"
                                        " contiguous in the first application, random in the others"},
    )
    nll_ratio: float = field(
        default=0.0, metadata={"help": "hidden width / embed_dim of a non-shared NLL after every application"
                                       " (SReT Eq. 6); 0: none, the published CCT"},
    )
    lrc: bool = field(default=False, metadata={"help": "learnable residual coefficients (SReT's LRC)"})
    attention_layer: str = field(
        default=DEFAULT_ATTENTION_LAYER,
        metadata={"help": "the layers' attention: a name registered with core.attention.register_attention_layer"},
    )
    conv_layers: int = field(default=2, metadata={"help": "convolution blocks of the tokenizer (the N of CCT-L/KxN)"})
    kernel_size: int = field(
        default=3, metadata={"help": "tokenizer kernel K; stride max(1, K//2 - 1), padding max(1, K//2) as published"}
    )
    tokenizer_dim: int = field(default=64, metadata={"help": "width of the tokenizer's inner convolutions"})
    img_size: Size = 32
    in_chans: int = 3
    num_classes: int = 10
    norm_eps: float = 1e-5
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.1
    drop_path_rate: float = field(default=0.1, metadata={"help": "stochastic depth (see _drop_path_rates)"})
    dynamic_img_size: bool = field(
        default=True, metadata={"help": "accept other input sizes by interpolating the position embedding"}
    )
    global_pool: str = field(
        default="seq", metadata={"help": "seq (sequence pooling, the paper's), avg, max, avgmax, or ''"
                                         " (none: the head at every position)"},
    )

    @property
    def conv_stride(self) -> int:
        return max(1, self.kernel_size // 2 - 1)

    @property
    def stride(self) -> int:
        """Down-sampling of the tokenizer: each block's convolution and its stride-2 pooling."""
        return (2 * self.conv_stride) ** self.conv_layers

    def schedule(self) -> RecursionSchedule:
        partition = PARTITION[: self.recursions] if self.partition is None else self.partition
        return RecursionSchedule.parse(
            self.recursions, groups=self.groups, partition=partition, repeat_last=True,
            names={"groups": "group counts", "partition": "partition modes"},
        )

    def validate(self) -> None:
        self.schedule()
        check_nll_ratio(self.nll_ratio)
        check_attention_layer(self.attention_layer)
        for name in ("lrc", "dynamic_img_size"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("embed_dim", "num_heads", "layers", "conv_layers", "kernel_size", "tokenizer_dim", "in_chans"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd (a convolution that keeps the size), got {self.kernel_size}")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide embed_dim={self.embed_dim}")
        if self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be > 0, got {self.mlp_ratio}")
        for size in _pair(self.img_size):
            if size < self.stride or size % self.stride:
                raise ValueError(f"img_size {self.img_size} must be a positive multiple of {self.stride}")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0: no classifier), got {self.num_classes}")
        for name in ("drop_rate", "attn_drop_rate", "drop_path_rate"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        _check_pool(self.global_pool)


def _check_pool(global_pool: str) -> str:
    if global_pool not in CCT_POOLS:
        raise ValueError(f"global_pool must be one of {CCT_POOLS}, got {global_pool!r}")
    return global_pool


class ConvTokenizerBlock(nn.Module):
    """KxK convolution (no bias), ReLU, 3x3 max pooling of stride 2:
    (B, C_in, H, W) -> (B, C_out, H / (2 s), W / (2 s)) for convolution stride s."""

    def __init__(self, in_dim: int, out_dim: int, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, kernel_size, stride=stride, padding=padding, bias=False)
        self.act = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(self.act(self.conv(x)))


class SequencePooling(nn.Module):
    """The paper's SeqPool: ``softmax_tokens(g(x))^T x`` with ``g`` a Linear(C, 1),
    tokens (B, N, C) -> (B, C)."""

    def __init__(self, dim: int):
        super().__init__()
        self.attention = nn.Linear(dim, 1)

    def forward(self, x: Tensor) -> Tensor:
        weights = F.softmax(self.attention(x), dim=1)  # (B, N, 1)
        return torch.matmul(weights.transpose(-1, -2), x).squeeze(-2)


def _drop_path_rates(cfg: CCTConfig) -> List[float]:
    """Stochastic-depth rate of each unique layer: the published CCT spaces the rates
    linearly from 0 to ``drop_path_rate`` over its layers; here over the ``layers *
    recursions`` applications, each unique layer taking the rate of its first application
    (the published rates when ``recursions == 1``)."""
    applications = cfg.layers * cfg.recursions
    return [cfg.drop_path_rate * i * cfg.recursions / max(applications - 1, 1) for i in range(cfg.layers)]


def _init_weights(module: nn.Module) -> None:
    """The published initialisation: truncated normal (std 0.02) linear weights and zero biases,
    LayerNorms at identity, Kaiming-normal convolutions."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Conv2d):
        nn.init.kaiming_normal_(module.weight)


# A torch.fx trace records these as calls (they decide on shapes and memory layout), as in
# sret/layers.py; wrapped here too, where this module's forward looks them up.
torch.fx.wrap("_prepare_input")
torch.fx.wrap("_add_pos_embed")
torch.fx.wrap("_tokens_to_map")


class CCT(ClassifierConventions, DepthControl, nn.Module):
    """Compact Convolutional Transformer, plain or recursive. (B, 3, H, W) -> (B, num_classes).

    Build with a :class:`CCTConfig` and/or keyword overrides of its fields, or use the
    registered constructors (``create_model("cct_2_3x2_32")``). A timm model like
    :class:`~fairseq_sret.vision.SReT`: ``forward_features`` gives the normalised tokens as a
    map (B, C, H/4, W/4), ``forward_head`` pools them (sequence pooling) and classifies. Its
    intermediates are the outputs of the tokenizer's blocks, then of each unique layer (after
    its last application).
    """

    def __init__(
        self, cfg: Optional[CCTConfig] = None, *, device: Optional[Union[str, torch.device]] = None,
        dtype: Optional[torch.dtype] = None, **kwargs,
    ):
        super().__init__()
        base = cfg or CCTConfig()
        cfg = replace(base, **translate_nll(kwargs, base.nll_ratio))
        cfg = replace(
            cfg, img_size=_pair(cfg.img_size), groups=_one_stage(_tuple(cfg.groups)),
            partition=None if cfg.partition is None else _tuple(cfg.partition),
        )
        cfg.validate()
        schedule = cfg.schedule()
        self.cfg = cfg = replace(cfg, groups=schedule.groups, partition=schedule.partitions)
        self.in_chans = cfg.in_chans
        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.dynamic_img_size = cfg.dynamic_img_size
        self.num_features = self.head_hidden_size = self.embed_dim = cfg.embed_dim
        dims = [cfg.in_chans] + [cfg.tokenizer_dim] * (cfg.conv_layers - 1) + [cfg.embed_dim]
        step = 2 * cfg.conv_stride
        self.feature_info = [
            dict(num_chs=dims[i + 1], reduction=step ** (i + 1), module=f"tokenizer.{i}")
            for i in range(cfg.conv_layers)
        ] + [dict(num_chs=cfg.embed_dim, reduction=cfg.stride, module=f"blocks.{i}") for i in range(cfg.layers)]
        recursion = RecursionSpec(
            embed_dim=cfg.embed_dim, schedule=schedule, lrc=cfg.lrc, nll_ratio=cfg.nll_ratio,
            activation="gelu", dropout=cfg.drop_rate, activation_dropout=cfg.drop_rate, norm_eps=cfg.norm_eps,
        )
        layer = SReTLayerSpec(
            recursion=recursion, num_heads=cfg.num_heads, ffn_dim=int(cfg.embed_dim * cfg.mlp_ratio),
            attention_dropout=cfg.attn_drop_rate, qkv_bias=False, normalize_stream_before_ffn=True,
            attention=cfg.attention_layer,
        )
        with build_on(device):
            self.tokenizer = nn.Sequential(*[
                ConvTokenizerBlock(a, b, cfg.kernel_size, cfg.conv_stride, max(1, cfg.kernel_size // 2))
                for a, b in zip(dims, dims[1:])
            ])
            grid = tuple(s // cfg.stride for s in cfg.img_size)
            self.pos_embed = nn.Parameter(torch.zeros(1, cfg.embed_dim, *grid))
            self.pos_drop = nn.Dropout(cfg.drop_rate)
            self.blocks = nn.ModuleList(replace(layer, drop_path=rate).build() for rate in _drop_path_rates(cfg))
            self.norm = nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)
            self.seq_pool = SequencePooling(cfg.embed_dim) if cfg.global_pool == "seq" else None
            self.head = nn.Linear(cfg.embed_dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
            self.apply(_init_weights)
            nn.init.trunc_normal_(self.pos_embed, std=0.2)
        if dtype is not None:
            self.to(dtype=dtype)

    # -------------------------------------------------------------- timm conventions
    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {"pos_embed"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """Parameter groups in depth order (layer-wise learning-rate decay): the tokenizer and
        the position embedding, each unique layer with its NLLs, the final norm with the last
        layer; the pooling and the head last."""
        return dict(stem=r"^tokenizer|^pos_embed", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A new head for ``num_classes`` (0: none); ``global_pool`` None keeps the pooling.
        Sequence pooling has weights: a change to ``seq`` builds fresh ones, a change away
        from it drops them."""
        if global_pool is not None:
            self.global_pool = _check_pool(global_pool)
            if global_pool != "seq":
                self.seq_pool = None
            elif self.seq_pool is None:
                reference = next(self.parameters())
                with build_on(reference.device):
                    self.seq_pool = SequencePooling(self.num_features).to(dtype=reference.dtype)
                self.seq_pool.apply(_init_weights)
                self.seq_pool.train(self.training)
        super().reset_classifier(num_classes)

    @property
    def reduction(self) -> int:
        return self.feature_info[len(self.tokenizer) - 1]["reduction"]

    # -------------------------------------------------------------- forward
    def _embed(self, x: Tensor) -> Tensor:
        """Tokenizer map (B, C, h, w) + position embedding -> tokens (B, hw, C)."""
        x = _add_pos_embed(x, self.pos_embed, self.dynamic_img_size, self.cfg.img_size, self.reduction)
        return self.pos_drop(x.flatten(2).transpose(1, 2).contiguous())  # a copy only if not channels-last

    def forward_features(self, x: Tensor) -> Tensor:
        """(B, in_chans, H, W) -> normalised tokens as a map (B, C, H/4, W/4)."""
        x = self.tokenizer(_prepare_input(x, self.in_chans, self.reduction))
        if self.pos_embed is None:  # pruned to the tokenizer
            return x
        tokens = self._embed(x)
        for block in self.blocks:
            tokens = block(tokens)
        return _tokens_to_map(self.norm(tokens), x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Map (B, C, h, w) -> pooled (B, C) -> head (B, num_classes); with ``global_pool=''``
        the head applies at every position: (B, num_classes or C, h, w)."""
        if not self.global_pool:
            return x if pre_logits else self.head(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        tokens = x.flatten(2).transpose(1, 2)
        if self.global_pool == "seq":
            x = self.seq_pool(tokens)
        else:
            x = pool_features(tokens, self.global_pool, (1,))
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    # -------------------------------------------------------------- intermediates
    def forward_intermediates(
        self, x: Tensor, indices: Union[None, int, Sequence[int]] = None, norm: bool = False,
        stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False,
    ) -> Union[List[Tensor], Tuple[Tensor, List[Tensor]]]:
        """``forward_features`` that also returns intermediates (timm's API): the outputs of the
        tokenizer's blocks, then of the unique layers. ``indices``: None all, an int n the last
        n, or a sequence; ``norm``: the layers' outputs through the final LayerNorm;
        ``stop_early``: run nothing after the last one returned; ``output_fmt``: ``NCHW`` or
        ``NHWC``. Returns the intermediates, or (final features, intermediates)."""
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        convs, layers = len(self.tokenizer), len(self.blocks)
        take, last_taken = feature_take_indices(convs + layers, indices)
        end = last_taken + 1 if stop_early else convs + layers
        intermediates = []

        def keep(feature: Tensor) -> None:
            intermediates.append(feature.permute(0, 2, 3, 1) if output_fmt == "NHWC" else feature)

        x = _prepare_input(x, self.in_chans, self.reduction)
        for i, block in enumerate(self.tokenizer[:end]):
            x = block(x)
            if i in take:
                keep(x)
        if end > convs:
            tokens = self._embed(x)
            for i, block in enumerate(self.blocks[: end - convs], start=convs):
                tokens = block(tokens)
                if i in take:
                    keep(_tokens_to_map(self.norm(tokens) if norm else tokens, x))
            if end == convs + layers:
                tokens = self.norm(tokens)
            x = _tokens_to_map(tokens, x)
        return intermediates if intermediates_only else (x, intermediates)

    def prune_intermediate_layers(
        self, indices: Union[int, Sequence[int]] = 1, prune_norm: bool = False, prune_head: bool = True,
    ) -> List[int]:
        """Remove what follows the last of ``indices`` (timm's API for backbones; the head too
        with ``prune_head``, the final LayerNorm with ``prune_norm``); returns the indices as
        absolute numbers. Pruned to a tokenizer block, the model ends there: no position
        embedding, layers, norm or head, and ``num_features`` is that block's width."""
        convs = len(self.tokenizer)
        take, last_taken = feature_take_indices(convs + len(self.blocks), indices)
        if last_taken < convs:
            self.tokenizer = self.tokenizer[: last_taken + 1]
            self.blocks = self.blocks[:0]
            self.pos_embed = None
            self.num_features = self.head_hidden_size = self.feature_info[last_taken]["num_chs"]
        else:
            self.blocks = self.blocks[: last_taken + 1 - convs]
        if prune_norm or last_taken < convs:
            self.norm = nn.Identity()
        if prune_head or last_taken < convs:
            self.reset_classifier(0, "")
        return take


def _tuple(value) -> tuple:
    return (value,) if isinstance(value, (int, str)) else tuple(value)


def _one_stage(groups: tuple) -> tuple:
    """Group counts per recursion, from themselves or from SReT's per-stage form with one stage
    (``sret-count --groups 4,1``); a ValueError for anything else."""
    if len(groups) == 1 and isinstance(groups[0], (tuple, list)):
        groups = tuple(groups[0])
    if not all(isinstance(g, (int, str)) and not isinstance(g, bool) for g in groups):
        raise ValueError(f"groups: one group count per recursion (a CCT has one stage), got {groups!r}")
    return groups


# ----------------------------------------------------------------------------- models
# The published CIFAR models (src/cct.py of SHI-Labs/Compact-Transformers and the paper's
# Table 1): CCT-2/3x2 and CCT-4/3x2, width 128, 2 heads, MLP ratio 1, 2 or 4 layers, a
# tokenizer of two 3x3 convolutions (64 then 128 channels), 32x32 inputs, 10 classes.
_CCT_3X2 = dict(embed_dim=128, num_heads=2, mlp_ratio=1.0, conv_layers=2, kernel_size=3)


def _cct(arch: dict, **kwargs) -> CCT:
    return CCT(**{**arch, **kwargs})


def _cifar_cfg() -> dict:
    return image_cfg(
        32, crop_pct=1.0, pool_size=(8, 8), first_conv="tokenizer.0.conv", classifier="head",
        mean=CIFAR10_MEAN, std=CIFAR10_STD, num_classes=10, fixed_input_size=False, license="mit",
        paper_name="Escaping the Big Data Paradigm with Compact Transformers", paper_ids="arXiv:2104.05704",
    )


@register_model(pretrained_cfg=_cifar_cfg())
def cct_2_3x2_32(**kwargs) -> CCT:
    """CCT-2/3x2 at 32x32 (CIFAR): two transformer layers, each applied once; 0.284M parameters."""
    return _cct(dict(_CCT_3X2, layers=2), **kwargs)


@register_model(pretrained_cfg=_cifar_cfg())
def cct_4_3x2_32(**kwargs) -> CCT:
    """CCT-4/3x2 at 32x32 (CIFAR): four transformer layers, each applied once; 0.482M parameters."""
    return _cct(dict(_CCT_3X2, layers=4), **kwargs)


@register_model(pretrained_cfg=_cifar_cfg())
def sret_cct_2_3x2_32(**kwargs) -> CCT:
    """Recursive CCT-2/3x2: CCT-2's two unique layers each applied twice (the applications of
    CCT-4), an NLL after every application and LRC on every residual, as SReT's layers;
    ``nll_ratio=0, lrc=False``: plain recursion, ``recursions=1`` with both off: CCT-2."""
    return _cct(dict(_CCT_3X2, layers=2, recursions=2, nll_ratio=1.0, lrc=True), **kwargs)
