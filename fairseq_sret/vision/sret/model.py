"""The SReT image classifier (paper Sec. 3-4) and its configuration.

Conv stem (three stride-2 conv-BN-ReLU) + learned position embedding, three stages of
recursive blocks (a shared :class:`~fairseq_sret.core.SReTBlock` applied twice, an NLL after
each application, LRC everywhere), depth-wise stride-2 conv pooling between stages, then
global average pooling, LayerNorm and a linear head (no class token). The layers are in
:mod:`.layers`, the paper's models in :mod:`.constructors`.
"""

from dataclasses import dataclass, field, replace
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.fx
from torch import Tensor, nn

from ...core import RecursionSchedule
from ...core.attention import DEFAULT_ATTENTION_LAYER
from ...core.depth import DepthControl
from ..conventions import (
    ClassifierConventions, build_on, check_attention_layer, check_global_pool, check_nll_ratio, feature_take_indices,
    pool_features,
)
from ..legacy import translate_nll
from .layers import ConvPooling, ConvStem, PatchStem, RecursiveStage, Size, _add_pos_embed, _pair, _prepare_input

# Groups per stage, one entry per recursion: the paper's final design [8,2][4,1][1,1].
SLICED_GROUPS = ((8, 2), (4, 1), (1, 1))
# The paper's "without slice" models: global attention in every application.
GLOBAL_GROUPS = ((1, 1), (1, 1), (1, 1))
# The first application uses contiguous slices, the later ones a permuted partition
# (a fresh random one in training; deterministic strided in eval(), see core.partition).
PARTITION = ("contiguous", "random")

# A torch.fx trace records these as calls (see .layers), wrapped here where SReT looks them up.
torch.fx.wrap("_prepare_input")
torch.fx.wrap("_add_pos_embed")


@dataclass
class SReTVisionConfig:
    """What an SReT image classifier is (:class:`SReT`): every option with its help text."""

    embed_dims: Tuple[int, ...] = field(
        default=(64, 128, 256), metadata={"help": "token width of each stage"}
    )
    num_heads: Tuple[int, ...] = field(default=(2, 4, 8), metadata={"help": "attention heads per stage"})
    blocks: Tuple[int, ...] = field(
        default=(2, 5, 3), metadata={"help": "shared (weight-tied) blocks per stage"}
    )
    recursions: int = field(
        default=2, metadata={"help": "applications each shared block is built (and trained) with; set_depth"
                                     " chooses how many of them run"},
    )
    groups: Tuple[Tuple[int, ...], ...] = field(
        default=SLICED_GROUPS,
        metadata={"help": "attention groups per stage and recursion (1 = global attention);"
                          " a stage listing fewer than `recursions` repeats its last entry"},
    )
    partition: Tuple[str, ...] = field(
        default=PARTITION,
        metadata={"help": "token partition per recursion (see core.partition); the last entry"
                          " repeats for further recursions"},
    )
    mlp_ratio: float = field(default=3.6, metadata={"help": "FFN hidden width / embed dim"})
    nll_ratio: float = field(
        default=1.0,
        metadata={"help": "hidden width / embed dim of a non-shared NLL after every application of a shared"
                          " block (paper Eq. 6); 0: none, the applications follow each other directly"},
    )
    stem: str = field(
        default="conv",
        metadata={"help": "'conv': three 3x3 conv-BN-ReLU layers (the paper's); 'patch': one linear"
                          " embedding of non-overlapping stem_stride x stem_stride patches (ViT's)"},
    )
    stem_stride: int = field(
        default=8,
        metadata={"help": "down-sampling of the stem (2, 4 or 8): the conv stem's first log2(stem_stride)"
                          " layers have stride 2, the others stride 1; the patch side of the patch stem"},
    )
    stem_dims: Optional[Tuple[int, int, int]] = field(
        default=None, metadata={"help": "stem conv widths; default (C/2, C, C) with C = embed_dims[0]"}
    )
    img_size: Size = field(default=224, metadata={"help": "input resolution (sets the position embedding)"})
    in_chans: int = 3
    num_classes: int = 1000
    lrc: bool = field(default=True, metadata={"help": "learnable residual coefficients (LRC)"})
    attention_layer: str = field(
        default=DEFAULT_ATTENTION_LAYER,
        metadata={"help": "the blocks' attention: a name registered with core.attention.register_attention_layer"},
    )
    norm_eps: float = 1e-6
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = field(default=0.1, metadata={"help": "stochastic depth (see _drop_path_rates)"})
    dynamic_img_size: bool = field(
        default=True,
        metadata={"help": "accept inputs of another size (sides divisible by 32) by interpolating the"
                          " position embedding (bicubic); False: only img_size"},
    )
    global_pool: str = field(
        default="avg", metadata={"help": "pooling before the head: avg (the paper's), max, avgmax, or ''"
                                         " (none: the head is applied at every position)"},
    )

    @property
    def stride(self) -> int:
        """Total down-sampling: ``stem_stride`` in the stem, 2 per conv pooling."""
        return self.stem_stride * 2 ** (len(self.embed_dims) - 1)

    def schedules(self) -> Tuple[RecursionSchedule, ...]:
        """The recursion schedule of each stage's shared blocks (validates groups/partition)."""
        return tuple(
            RecursionSchedule.parse(
                self.recursions, groups=g, partition=self.partition, repeat_last=True,
                names={"groups": f"group counts of stage {s}", "partition": "partition modes"},
            )
            for s, g in enumerate(self.groups)
        )

    def validate(self) -> None:
        n = len(self.embed_dims)
        for name in ("num_heads", "blocks", "groups"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} lists {len(getattr(self, name))} stages, embed_dims lists {n}")
        self.schedules()
        check_nll_ratio(self.nll_ratio)
        check_attention_layer(self.attention_layer)
        for name in ("lrc", "dynamic_img_size"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.stem not in ("conv", "patch"):
            raise ValueError(f"stem must be 'conv' or 'patch', got {self.stem!r}")
        if self.stem_stride not in (2, 4, 8):
            raise ValueError(f"stem_stride must be 2, 4 or 8, got {self.stem_stride}")
        for a, b in zip(self.embed_dims, self.embed_dims[1:]):
            if b % a != 0:
                raise ValueError(f"embed_dims must grow by integer factors (depth-wise pooling), got {a} -> {b}")
        for size in _pair(self.img_size):
            if size < self.stride or size % self.stride != 0:
                raise ValueError(f"img_size {self.img_size} must be a positive multiple of {self.stride}")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0: no classifier), got {self.num_classes}")
        for name in ("drop_rate", "attn_drop_rate", "drop_path_rate"):  # as given, not scaled per block
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        check_global_pool(self.global_pool)


def _drop_path_rates(cfg: SReTVisionConfig) -> List[List[float]]:
    """Stochastic-depth rate of every shared block, as in the official code.

    The official code spaces the rates over the ``sum(blocks * recursions)`` layer
    applications, ``rate * i / total`` with ``i`` counting from the stage's first
    application, and gives shared block ``b`` of a stage the ``b``-th rate of its stage.
    """
    total = sum(cfg.blocks) * cfg.recursions
    rates, first = [], 0
    for n in cfg.blocks:
        rates.append([cfg.drop_path_rate * (first + b) / total for b in range(n)])
        first += n * cfg.recursions
    return rates


class SReT(ClassifierConventions, DepthControl, nn.Module):
    """Sliced Recursive Transformer for image classification.

    Build with a :class:`SReTVisionConfig` and/or keyword overrides of its fields, or use the
    registered constructors (``create_model("sret_t")``). (B, 3, H, W) -> (B, num_classes).
    ``device`` / ``dtype``: where and in which floating-point type the parameters live (the
    tensors are created on ``device``).

    A timm model (``docs/vision.md``): ``forward_features`` / ``forward_head``,
    ``reset_classifier``, ``group_matcher``, ``no_weight_decay``, ``set_grad_checkpointing``,
    ``feature_info``, ``forward_intermediates`` and ``prune_intermediate_layers``. Its
    intermediates are the outputs of the three stages (strides 8, 16, 32): inside a stage every
    application of a shared block keeps the resolution and width, so the stage's last
    application is the one feature a stage contributes.
    """

    def __init__(
        self, cfg: Optional[SReTVisionConfig] = None, *, device: Optional[Union[str, torch.device]] = None,
        dtype: Optional[torch.dtype] = None, **kwargs,
    ):
        super().__init__()
        base = cfg or SReTVisionConfig()
        cfg = replace(base, **translate_nll(kwargs, base.nll_ratio))
        cfg = replace(
            cfg,
            img_size=_pair(cfg.img_size),
            groups=tuple(tuple(g) for g in cfg.groups),
            partition=(cfg.partition,) if isinstance(cfg.partition, str) else tuple(cfg.partition),
        )
        cfg.validate()
        schedules = cfg.schedules()
        cfg = replace(cfg, groups=tuple(s.groups for s in schedules), partition=schedules[0].partitions)
        self.cfg = cfg
        self.in_chans = cfg.in_chans
        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.dynamic_img_size = cfg.dynamic_img_size
        self.num_features = self.head_hidden_size = self.embed_dim = cfg.embed_dims[-1]
        self.feature_info = [
            dict(num_chs=dim, reduction=cfg.stem_stride * 2**s, module=f"stages.{s}")
            for s, dim in enumerate(cfg.embed_dims)
        ]
        dim0 = cfg.embed_dims[0]
        stem_dims = cfg.stem_dims or (dim0 // 2, dim0, dim0)
        if stem_dims[-1] != dim0:
            raise ValueError(f"the stem must end at embed_dims[0]={dim0}, got {stem_dims}")

        with build_on(device):
            if cfg.stem == "conv":
                self.stem = ConvStem(cfg.in_chans, stem_dims, cfg.stem_stride)
            else:
                self.stem = PatchStem(cfg.in_chans, dim0, cfg.stem_stride)
            grid = tuple(s // cfg.stem_stride for s in cfg.img_size)
            self.pos_embed = nn.Parameter(torch.zeros(1, dim0, *grid))
            self.pos_drop = nn.Dropout(cfg.drop_rate)
            drop_paths = _drop_path_rates(cfg)
            self.stages = nn.ModuleList(
                RecursiveStage(
                    cfg.embed_dims[s], cfg.num_heads[s], cfg.blocks[s], schedules[s],
                    cfg.mlp_ratio, cfg.nll_ratio, drop_paths[s], lrc=cfg.lrc,
                    norm_eps=cfg.norm_eps, drop_rate=cfg.drop_rate, attn_drop_rate=cfg.attn_drop_rate,
                    attention_layer=cfg.attention_layer,
                )
                for s in range(len(cfg.embed_dims))
            )
            self.pools = nn.ModuleList(
                ConvPooling(a, b) for a, b in zip(cfg.embed_dims, cfg.embed_dims[1:])
            )
            self.norm = nn.LayerNorm(self.num_features, eps=cfg.norm_eps)
            self.head = nn.Linear(self.num_features, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if dtype is not None:
            self.to(dtype=dtype)

    # -------------------------------------------------------------- timm conventions
    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {"pos_embed"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """Parameter groups in depth order for layer-wise learning-rate decay: the stem and the
        position embedding, then each shared block with its NLLs (coarse: each stage), the
        pooling after a stage with that stage's last block; the head's norm and linear last."""
        return dict(
            stem=r"^stem|^pos_embed",
            blocks=r"^(?:stages|pools)\.(\d+)" if coarse else [
                (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                (r"^pools\.(\d+)", (99999,)),  # timm's MATCH_PREV_GROUP: with the block before
            ],
        )

    @property
    def reduction(self) -> int:
        """Down-sampling from the input to the last stage's map."""
        return self.feature_info[len(self.stages) - 1]["reduction"]

    # -------------------------------------------------------------- forward
    def _stem_forward(self, x: Tensor) -> Tensor:
        x = self.stem(_prepare_input(x, self.in_chans, self.reduction))
        return self.pos_drop(
            _add_pos_embed(x, self.pos_embed, self.dynamic_img_size, self.cfg.img_size, self.cfg.stem_stride)
        )

    def forward_features(self, x: Tensor) -> Tensor:
        """(B, in_chans, H, W) -> last-stage feature map (B, C, H/32, W/32)."""
        x = self._stem_forward(x)
        for s, stage in enumerate(self.stages):
            if s > 0:
                x = self.pools[s - 1](x)
            x = stage(x)
        return x

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Feature map (B, C, h, w) -> global pooling -> LayerNorm -> head: (B, num_classes), or
        (B, C) with ``pre_logits``. With ``global_pool=''`` the LayerNorm and the head apply at
        every position: (B, num_classes or C, h, w)."""
        if not self.global_pool:
            x = self.norm(x.permute(0, 2, 3, 1))
            return (x if pre_logits else self.head(x)).permute(0, 3, 1, 2)
        x = self.norm(pool_features(x, self.global_pool, (2, 3)))
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    # -------------------------------------------------------------- intermediates
    def forward_intermediates(
        self, x: Tensor, indices: Union[None, int, Sequence[int]] = None, norm: bool = False,
        stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False,
    ) -> Union[List[Tensor], Tuple[Tensor, List[Tensor]]]:
        """``forward_features`` that also returns stage outputs (timm's API).

        ``indices``: the stages to return (None: all, an int n: the last n, or a sequence);
        ``norm``: the last stage's map through the model's LayerNorm at every position (the
        only stage of its width); ``stop_early``: run no stage after the last one returned;
        ``output_fmt``: ``NCHW`` or ``NHWC``. Returns the intermediates, or (final features,
        intermediates); the final features are ``forward_features(x)`` unless stopped early.
        """
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        take, last_taken = feature_take_indices(len(self.stages), indices)
        last = len(self.stages) - 1
        intermediates = []
        x = self._stem_forward(x)
        for s, stage in enumerate(self.stages[: last_taken + 1] if stop_early else self.stages):
            if s > 0:
                x = self.pools[s - 1](x)
            x = stage(x)
            if s in take:
                feature = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2) if norm and s == last else x
                intermediates.append(feature.permute(0, 2, 3, 1) if output_fmt == "NHWC" else feature)
        return intermediates if intermediates_only else (x, intermediates)

    def prune_intermediate_layers(
        self, indices: Union[int, Sequence[int]] = 1, prune_norm: bool = False, prune_head: bool = True,
    ) -> List[int]:
        """Remove the stages after the last of ``indices`` (and the head, the LayerNorm if asked:
        timm's API for backbones); returns the indices as absolute stage numbers. When stages are
        removed, the features end at the last one kept: ``num_features`` becomes its width and
        the LayerNorm, sized for the last stage, goes too."""
        take, last_taken = feature_take_indices(len(self.stages), indices)
        prune_end = last_taken < len(self.stages) - 1
        self.stages = self.stages[: last_taken + 1]
        self.pools = self.pools[:last_taken]
        if prune_norm or prune_end:
            self.norm = nn.Identity()
        if prune_end:
            self.num_features = self.head_hidden_size = self.feature_info[last_taken]["num_chs"]
        if prune_head or prune_end:
            self.reset_classifier(0, "")
        return take
