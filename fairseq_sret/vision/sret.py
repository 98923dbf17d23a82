"""SReT image classifiers (paper Sec. 3-4, Appendix "Details of Our SReT Architectures").

Conv stem (three stride-2 conv-BN-ReLU) + learned position embedding, three stages of
recursive blocks (a shared :class:`~fairseq_sret.core.SReTBlock` applied twice, an NLL
after each application, LRC everywhere), depth-wise stride-2 conv pooling between stages,
then global average pooling, LayerNorm and a linear head (no class token).

Everything attention-related comes from :mod:`fairseq_sret.core`, the same modules as the
translation models. Constructors for the paper's models are at the bottom of this file;
their parameter counts equal the official implementation's (szq0214/SReT) and
:func:`fairseq_sret.vision.load_checkpoint` loads official checkpoints.
"""

from dataclasses import dataclass, field, replace
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from ..core import RecursionSchedule, RecursionSpec, SReTLayerSpec
from ..core.depth import DepthControl
from ..core.linear import no_forward_hooks
from .conventions import ClassifierConventions, build_on, check_global_pool, feature_take_indices, pool_features
from .registry import image_cfg, register_model

Size = Union[int, Tuple[int, int]]

# Groups per stage, one entry per recursion: the paper's final design [8,2][4,1][1,1].
SLICED_GROUPS = ((8, 2), (4, 1), (1, 1))
# The paper's "without slice" models: global attention in every application.
GLOBAL_GROUPS = ((1, 1), (1, 1), (1, 1))
# The first application uses contiguous slices, the later ones a permuted partition
# (a fresh random one in training; deterministic strided in eval(), see core.partition).
PARTITION = ("contiguous", "random")


def _pair(size: Size) -> Tuple[int, int]:
    return (size, size) if isinstance(size, int) else tuple(size)


@dataclass
class SReTConfig:
    embed_dims: Tuple[int, ...] = field(
        default=(64, 128, 256), metadata={"help": "token width of each stage"}
    )
    num_heads: Tuple[int, ...] = field(default=(2, 4, 8), metadata={"help": "attention heads per stage"})
    blocks: Tuple[int, ...] = field(
        default=(2, 5, 3), metadata={"help": "shared (weight-tied) blocks per stage"}
    )
    recursions: int = field(default=2, metadata={"help": "applications of each shared block"})
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
    nll_ratio: float = field(default=1.0, metadata={"help": "NLL hidden width / embed dim"})
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
    nll: bool = field(
        default=True,
        metadata={"help": "a non-shared NLL after every application of a shared block (paper Eq. 6);"
                          " False: the applications follow each other directly (plain recursion)"},
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
        for name in ("nll", "lrc", "dynamic_img_size"):
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


class ConvBNReLU(nn.Sequential):
    """3x3 convolution, BatchNorm, ReLU: (B, C_in, H, W) -> (B, C_out, H/s, W/s), stride s 2 or 1.

    In eval mode the BatchNorm is an affine map of its running statistics, so it is folded
    into the convolution on the fly (``w * g / sqrt(var + eps)``, ``(b - mean) * g /
    sqrt(var + eps) + beta``): one convolution and an in-place ReLU instead of three passes
    over the stem's largest activations (:func:`~fairseq_sret.core.fold_lrc`'s inference copy
    folds once, :meth:`fold_norm_for_inference`). The parameters and the state dict are
    unchanged; a hook on the convolution or the BatchNorm (or a global one) keeps the three
    separate calls.
    """

    def __init__(self, in_dim: int, out_dim: int, stride: int = 2):
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, kernel_size=3, stride=stride, padding=1, bias=True)
        self.norm = nn.BatchNorm2d(out_dim)
        self.act = nn.ReLU(inplace=True)
        self.register_buffer("inference_weight", None, persistent=False)
        self.register_buffer("inference_bias", None, persistent=False)

    def _folds_norm(self) -> bool:
        return isinstance(self.norm, nn.BatchNorm2d) and self.norm.running_var is not None

    def _folded_weight_and_bias(self) -> Tuple[Tensor, Tensor]:
        conv, norm = self.conv, self.norm
        scale = torch.rsqrt(norm.running_var + norm.eps)
        if norm.weight is not None:
            scale = scale * norm.weight
        bias = -norm.running_mean * scale if conv.bias is None else (conv.bias - norm.running_mean) * scale
        if norm.bias is not None:
            bias = bias + norm.bias
        weight = conv.weight * scale.reshape(-1, 1, 1, 1).to(conv.weight.dtype)
        return weight, bias.to(conv.weight.dtype)

    def forward(self, x: Tensor) -> Tensor:
        conv, norm = self.conv, self.norm
        if self.training or not self._folds_norm() or not (no_forward_hooks(conv) and no_forward_hooks(norm)):
            return super().forward(x)
        if self.inference_weight is not None:
            weight, bias = self.inference_weight, self.inference_bias
        else:
            weight, bias = self._folded_weight_and_bias()
        return F.relu(conv._conv_forward(x, weight, bias), inplace=True)

    def fold_norm_for_inference(self) -> None:
        """Compute the folded weight and bias once, as the inference copy of
        :func:`fairseq_sret.core.fold_lrc` does, instead of on every call in eval mode. They
        are buffers outside the state dict, dropped when the module trains again (its
        statistics change); training mode runs the convolution and the BatchNorm as ever."""
        if self._folds_norm():
            with torch.no_grad():
                self.inference_weight, self.inference_bias = self._folded_weight_and_bias()

    def reparameterize(self) -> None:
        """timm's ``reparameterize_model`` hook: :meth:`fold_norm_for_inference`."""
        self.fold_norm_for_inference()

    def train(self, mode: bool = True) -> "ConvBNReLU":
        if mode:
            self.inference_weight = self.inference_bias = None
        return super().train(mode)


class ConvStem(nn.Sequential):
    """3x3 conv-BN-ReLU layers, the first log2(stride) of them with stride 2 (all three at the
    paper's stride 8): (B, 3, H, W) -> (B, C, H/stride, W/stride)."""

    def __init__(self, in_chans: int, dims: Sequence[int], stride: int = 8):
        halvings = stride.bit_length() - 1
        if 2**halvings != stride or halvings > len(dims):
            raise ValueError(f"a stem of {len(dims)} layers cannot down-sample by {stride}")
        dims = [in_chans] + list(dims)
        super().__init__(*[
            ConvBNReLU(a, b, 2 if i < halvings else 1) for i, (a, b) in enumerate(zip(dims, dims[1:]))
        ])


class PatchStem(nn.Module):
    """ViT's patch embedding: a linear map of each non-overlapping ``stride`` x ``stride``
    patch, (B, 3, H, W) -> (B, C, H/stride, W/stride)."""

    def __init__(self, in_chans: int, dim: int, stride: int):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=stride, stride=stride)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


class ConvPooling(nn.Module):
    """Depth-wise 3x3 stride-2 conv between stages: (B, C, H, W) -> (B, kC, H/2, W/2)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, kernel_size=3, stride=2, padding=1, groups=in_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


class RecursiveStage(nn.Module):
    """Shared blocks, each applied ``len(schedule)`` times with its own NLL after every application.

    ``z = NLL_2(F(NLL_1(F(z))))`` per shared block F (paper Eq. 6), ``z = F(F(z))`` with
    ``nll=False``; ``schedule[r]`` sets the attention groups and partition of application ``r``.
    (B, C, H, W) -> (B, C, H, W); tokens are the pixels in row-major order, so contiguous slices
    are bands of rows. The output keeps the input's memory format (``torch.channels_last`` or
    contiguous).
    """

    def __init__(
        self, dim: int, num_heads: int, num_blocks: int, schedule: RecursionSchedule,
        mlp_ratio: float, nll_ratio: float, drop_paths: Sequence[float],
        lrc: bool = True, nll: bool = True, norm_eps: float = 1e-6, drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
    ):
        super().__init__()
        if nll and nll_ratio <= 0:
            raise ValueError(f"NLL hidden_ratio must be > 0, got {nll_ratio}")
        recursion = RecursionSpec(
            embed_dim=dim, schedule=schedule, lrc=lrc, nll_ratio=nll_ratio if nll else 0.0, activation="gelu",
            dropout=drop_rate, activation_dropout=drop_rate, norm_eps=norm_eps,
        )
        layer = SReTLayerSpec(
            recursion=recursion, num_heads=num_heads, ffn_dim=int(dim * mlp_ratio), attention_dropout=attn_drop_rate,
        )
        self.blocks = nn.ModuleList(replace(layer, drop_path=drop_paths[b]).build() for b in range(num_blocks))

    def forward(self, x: Tensor) -> Tensor:
        # Tokens (B, HW, C), made contiguous once here: a transposed view would make every
        # LayerNorm copy its input and every residual sum run on strided memory. Free for a
        # channels-last input, whose memory already is (B, H, W, C).
        tokens = x.flatten(2).transpose(1, 2).contiguous()
        for block in self.blocks:
            tokens = block(tokens)
        return _tokens_to_map(tokens, x)


def _tokens_to_map(tokens: Tensor, like: Tensor) -> Tensor:
    """Tokens (B, HW, C) -> a map shaped and laid out in memory like ``like`` (B, C, H, W)."""
    x = tokens.transpose(1, 2).reshape(like.shape)  # a channels-last view
    channels_last = like.is_contiguous(memory_format=torch.channels_last) and not like.is_contiguous()
    return x if channels_last else x.contiguous()


def _prepare_input(x: Tensor, in_chans: int, stride: int) -> Tensor:
    """Check an image batch (B, in_chans, H, W), H and W divisible by ``stride``; on the CPU in
    channels-last memory."""
    if x.dim() != 4 or x.size(1) != in_chans:
        raise ValueError(f"expected input (B, {in_chans}, H, W), got {tuple(x.shape)}")
    if x.size(2) % stride or x.size(3) % stride:
        raise ValueError(f"input height and width must be divisible by {stride}, got {tuple(x.shape[-2:])}")
    if x.device.type == "cpu":
        # oneDNN's convolutions run several times faster on channels-last input (the
        # stem's first, 3-channel convolution about 5x at 224 px), and the stages then
        # read their tokens, (B, H, W, C) in memory, without a copy
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _add_pos_embed(
    x: Tensor, pos_embed: Tensor, dynamic: bool, img_size: Tuple[int, int], stem_stride: int = 8
) -> Tensor:
    """The stem's map (B, C, h, w) plus the position embedding, interpolated to (h, w) if needed."""
    grid = tuple(x.shape[-2:])
    if grid != tuple(pos_embed.shape[-2:]):
        if not dynamic:
            raise ValueError(
                f"input of {grid[0] * stem_stride}x{grid[1] * stem_stride} pixels, but the model was built for"
                f" {img_size[0]}x{img_size[1]} with dynamic_img_size=False; build it with img_size=..."
                " (load_checkpoint interpolates the position embedding) or dynamic_img_size=True"
            )
        pos_embed = resize_pos_embed(pos_embed, grid)
    return x + pos_embed


# A torch.fx trace records these as calls: they decide on shapes, memory layout and device,
# which a symbolic trace does not know; the graph decides when it runs, as eager mode does.
torch.fx.wrap("_tokens_to_map")
torch.fx.wrap("_prepare_input")
torch.fx.wrap("_add_pos_embed")


def _drop_path_rates(cfg: SReTConfig) -> List[List[float]]:
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


def resize_pos_embed(pos_embed: Tensor, size: Tuple[int, int]) -> Tensor:
    """Bicubic interpolation of a (1, C, h, w) position embedding to (1, C, *size)."""
    if tuple(pos_embed.shape[-2:]) == tuple(size):
        return pos_embed
    return F.interpolate(pos_embed, size=size, mode="bicubic", align_corners=False)


class SReT(ClassifierConventions, DepthControl, nn.Module):
    """Sliced Recursive Transformer for image classification.

    Build with a :class:`SReTConfig` and/or keyword overrides of its fields, or use the
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
        self, cfg: Optional[SReTConfig] = None, *, device: Optional[Union[str, torch.device]] = None,
        dtype: Optional[torch.dtype] = None, **kwargs,
    ):
        super().__init__()
        cfg = replace(cfg or SReTConfig(), **kwargs)
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
                    cfg.mlp_ratio, cfg.nll_ratio, drop_paths[s], lrc=cfg.lrc, nll=cfg.nll,
                    norm_eps=cfg.norm_eps, drop_rate=cfg.drop_rate, attn_drop_rate=cfg.attn_drop_rate,
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


# ----------------------------------------------------------------------------- models
# Hyper-parameters of the official SReT.py and the paper's appendix table. Each stage has
# (2, 5, 3) shared blocks applied twice: 20 layers; head width 32 (T, TL) or 42 (S).
#
# SReT-B exists only in the appendix table, which is inconsistent: its widths
# 336/672/1344 give 144.7M parameters, not the stated 71.2M. Keeping everything else from
# the table (stem 96-168-336, FFN 3.0, NLL 2.0, blocks 2/5/3) with a last stage of width
# 672 gives 70.8M (-0.5%), the one change of a single table entry we found that comes
# within 1%. The table gives no heads; we keep SReT-S's head width 42.
# embed_dims=(336, 672, 1344) builds the table as printed.
_SRET_T = dict(embed_dims=(64, 128, 256), num_heads=(2, 4, 8), mlp_ratio=3.6, nll_ratio=1.0)
_SRET_TL = dict(embed_dims=(64, 128, 256), num_heads=(2, 4, 8), mlp_ratio=4.0, nll_ratio=1.0)
_SRET_EXT = dict(_SRET_T, blocks=(1, 2, 3))  # derived, see sret_ext
_SRET_S = dict(embed_dims=(126, 252, 504), num_heads=(3, 6, 12), mlp_ratio=3.0, nll_ratio=2.0, drop_path_rate=0.2)
_SRET_B = dict(
    embed_dims=(336, 672, 672), num_heads=(8, 16, 16), mlp_ratio=3.0, nll_ratio=2.0,
    stem_dims=(96, 168, 336), drop_path_rate=0.2,
)


def _sret(arch: dict, **kwargs) -> SReT:
    return SReT(**{**arch, **kwargs})


def _cfg(img_size: int = 224, weights: Optional[str] = None) -> dict:
    """The pretrained config of an SReT model at ``img_size``. ``weights``: the official
    checkpoint of this architecture in the SReT repository's table (none bundled: load the
    file with ``pretrained=True, pretrained_cfg_overlay=dict(file=...)``)."""
    cfg = image_cfg(
        img_size, pool_size=(img_size // 32, img_size // 32), first_conv="stem.0.conv", classifier="head",
        fixed_input_size=False, license="mit", paper_name="Sliced Recursive Transformer",
        paper_ids="arXiv:2111.05297",
    )
    if weights:
        cfg.update(origin_url="https://github.com/szq0214/SReT",
                   notes=(f"official ImageNet-1k weights: {weights}",))
    return cfg


@register_model(pretrained_cfg=_cfg(weights="SReT_T"))
def sret_t(**kwargs) -> SReT:
    """SReT-T: 4.76M parameters, 1.11G MACs at 224x224."""
    return _sret(_SRET_T, **kwargs)


@register_model(pretrained_cfg=_cfg(weights="SReT_LT [8-4-1,2-1-1]"))
def sret_tl(**kwargs) -> SReT:
    """SReT-TL (official name SReT_LT): 4.99M parameters, 1.16G MACs."""
    return _sret(_SRET_TL, **kwargs)


@register_model(pretrained_cfg=_cfg(weights="SReT_S"))
def sret_s(**kwargs) -> SReT:
    """SReT-S: 20.9M parameters, 4.17G MACs."""
    return _sret(_SRET_S, **kwargs)


@register_model(pretrained_cfg=_cfg())
def sret_b(**kwargs) -> SReT:
    """SReT-B (appendix table, reconciled to its 71.2M parameters; see above): 70.8M."""
    return _sret(_SRET_B, **kwargs)


@register_model(pretrained_cfg=_cfg())
def sret_ext(**kwargs) -> SReT:
    """SReT-ExT, the paper's smallest model (4.0M parameters, 0.7G FLOPs, 74.0% top-1):
    3,938,017 parameters (-1.5%) and 0.688G MACs (-1.8%) at 224x224, as ``count_params`` /
    ``count_macs`` count them.

    The paper lists only those numbers; neither its appendix nor the official code gives
    the layout, so this one is derived. It is SReT-T with fewer shared blocks and nothing
    else changed: widths 64/128/256, heads 2/4/8 (head width 32), FFN ratio 3.6, NLL ratio
    1.0, stem, two recursions and groups [8,2][4,1][1,1] are SReT-T's; the shared blocks
    per stage go from (2, 5, 3) to (1, 2, 3).

    Why the blocks: from SReT-T (4.756M, 1.112G) the MACs must fall by 37% and the
    parameters only by 16%. A shared block (two applications, two NLLs) costs, at the
    three stages: stage 1 (28x28 tokens, width 64) 64K parameters and 134M MACs, stage 2
    (14x14, 128) 251K and 97M, stage 3 (7x7, 256) 1.0M and 87M. Three stage-2 blocks
    remove 754K parameters and 291M MACs (4.00M, 0.82G: the parameters are on target),
    and one stage-1 block the remaining MACs for few parameters (-134M, -64K). Keeping
    stage 3 keeps the final feature width and most parameters, where the FLOPs are cheap.
    The other knobs cut parameters and MACs at about the same rate, so they cannot reach
    both targets: an FFN ratio of 2.3 gives 4.01M parameters at 0.95G MACs, widths
    56/112/224 3.68M at 0.87G; more attention groups only cut the attention's 15% of the
    MACs.
    """
    return _sret(_SRET_EXT, **kwargs)


@register_model(pretrained_cfg=_cfg(weights="SReT_⋇T"))
def sret_t_wo_slice(**kwargs) -> SReT:
    """SReT-T without sliced attention (the paper's SReT-⋇T): 1.37G MACs."""
    return _sret(_SRET_T, groups=GLOBAL_GROUPS, **kwargs)


@register_model(pretrained_cfg=_cfg(weights="SReT_⋇LT"))
def sret_tl_wo_slice(**kwargs) -> SReT:
    """SReT-TL without sliced attention (SReT-⋇TL): 1.42G MACs."""
    return _sret(_SRET_TL, groups=GLOBAL_GROUPS, **kwargs)


@register_model(pretrained_cfg=_cfg(weights="SReT_⋇S"))
def sret_s_wo_slice(**kwargs) -> SReT:
    """SReT-S without sliced attention (SReT-⋇S)."""
    return _sret(_SRET_S, groups=GLOBAL_GROUPS, **kwargs)


@register_model(pretrained_cfg=_cfg())
def sret_b_wo_slice(**kwargs) -> SReT:
    """SReT-B without sliced attention."""
    return _sret(_SRET_B, groups=GLOBAL_GROUPS, **kwargs)


# Distilled (and fine-tuned) models have the architecture of their base model; the names
# identify checkpoints trained with soft distillation (``--teacher-*`` in
# sret-train-vision) and, with a resolution suffix, fine-tuned at that resolution.
_VARIANTS = {  # name: (base model, its settings, the official checkpoint or None)
    "sret_t_distill": (sret_t, {}, "SReT_T_Distill"),
    "sret_tl_distill": (sret_tl, {}, "SReT_LT_Distill"),
    "sret_s_distill": (sret_s, {}, None),
    "sret_b_distill": (sret_b, {}, None),
    "sret_t_wo_slice_distill": (sret_t_wo_slice, {}, "SReT_⋇T_Distill"),
    "sret_tl_wo_slice_distill": (sret_tl_wo_slice, {}, "SReT_⋇LT_Distill"),
    "sret_s_wo_slice_distill": (sret_s_wo_slice, {}, None),
    "sret_t_distill_384": (sret_t, {"img_size": 384}, None),
    "sret_tl_distill_384": (sret_tl, {"img_size": 384}, None),
    "sret_t_wo_slice_distill_384": (sret_t_wo_slice, {"img_size": 384}, "SReT_⋇T_Distill_Finetune384"),
    "sret_tl_wo_slice_distill_384": (sret_tl_wo_slice, {"img_size": 384}, None),
    "sret_s_wo_slice_distill_384": (sret_s_wo_slice, {"img_size": 384}, "SReT_⋇S_Distill_Finetune384"),
    "sret_s_wo_slice_distill_512": (sret_s_wo_slice, {"img_size": 512}, "SReT_⋇S_Distill_Finetune512"),
}


def _variant(name: str, base, defaults: dict, weights: Optional[str]):
    def constructor(**kwargs) -> SReT:
        return base(**{**defaults, **kwargs})

    constructor.__name__ = constructor.__qualname__ = name
    size = defaults.get("img_size")
    constructor.__doc__ = f"{base.__name__} trained with soft distillation" + (
        f", fine-tuned at {size}x{size}." if size else "."
    )
    return register_model(constructor, pretrained_cfg=_cfg(size or 224, weights))


for _name, (_base, _defaults, _weights) in _VARIANTS.items():
    globals()[_name] = _variant(_name, _base, _defaults, _weights)


# ----------------------------------------------------------------------------- CIFAR scale
# SReT-T's design at 32x32 pixels, sized so that one training run fits a few CPU-hours on one
# thread (docs/results/cifar10.md): the stem down-samples by 4, not 8, so the three stages see
# 8x8, 4x4 and 2x2 tokens; widths, heads, FFN and NLL ratios and groups are SReT-T's, with
# one, two and one shared blocks (8 layer applications). Each of the paper's ablation steps
# changes one field: ``recursions``, ``nll``, ``lrc``, ``groups``, ``stem``.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
_SRET_CIFAR = dict(_SRET_T, blocks=(1, 2, 1), img_size=32, stem_stride=4, num_classes=10)
# The non-recursive baseline of the same family: plain pre-LN transformer blocks (no NLL, no
# LRC, global attention), each applied once, on the same stem and widths.
_CIFAR_BASELINE = dict(
    _SRET_CIFAR, recursions=1, nll=False, lrc=False, groups=((1,), (1,), (1,)), partition=("contiguous",)
)


def _cifar_cfg() -> dict:
    return image_cfg(
        32, crop_pct=1.0, pool_size=(2, 2), first_conv="stem.0.conv", classifier="head",
        mean=CIFAR10_MEAN, std=CIFAR10_STD, num_classes=10, fixed_input_size=False, license="mit",
    )


@register_model(pretrained_cfg=_cifar_cfg())
def sret_cifar(**kwargs) -> SReT:
    """SReT at CIFAR scale (32x32, 10 classes): SReT-T's stages with (1, 2, 1) shared blocks
    applied twice, a stride-4 conv stem, NLL, LRC and sliced groups; 1.64M parameters."""
    return _sret(_SRET_CIFAR, **kwargs)


@register_model(pretrained_cfg=_cifar_cfg())
def sret_cifar_wo_slice(**kwargs) -> SReT:
    """:func:`sret_cifar` with global attention in every application."""
    return _sret(_SRET_CIFAR, groups=GLOBAL_GROUPS, **kwargs)


@register_model(pretrained_cfg=_cifar_cfg())
def sret_cifar_baseline(**kwargs) -> SReT:
    """The non-recursive baseline with SReT-CIFAR's unique blocks: (1, 2, 1) plain transformer
    blocks applied once (no NLL, no LRC, global attention), the same stem and widths; the same
    model as ``sret_cifar(recursions=1, nll=False, lrc=False, groups=((1,), (1,), (1,)),
    partition=("contiguous",))``."""
    return _sret(_CIFAR_BASELINE, **kwargs)


@register_model(pretrained_cfg=_cifar_cfg())
def sret_cifar_baseline_deep(**kwargs) -> SReT:
    """The non-recursive baseline with SReT-CIFAR's layer applications: (2, 4, 2) unique
    plain blocks, so the same compute per image as :func:`sret_cifar_wo_slice` without NLLs."""
    return _sret(_CIFAR_BASELINE, blocks=(2, 4, 2), **kwargs)
