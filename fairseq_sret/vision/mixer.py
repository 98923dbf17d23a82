"""Recursive MLP-Mixer (paper Sec. 3 "Recursive All-MLP", Appendix "All-MLP Structure").

Mixer-B/16 (Tolstikhin et al.): 16x16 patches, 12 layers, hidden size 768, token-mixing
MLP 384, channel-mixing MLP 3072. The paper applies every Mixer layer twice,
``Y = M(M(X))``, with learnable residual coefficients (LRC) on both mixing steps and no NLL
("NLL is not used here for simplicity"):

    U = beta * X + alpha * TokenMLP(LN(X)^T)^T
    Y = delta * U + gamma * ChannelMLP(LN(U))

Recursion comes from :class:`fairseq_sret.core.Recursive`, the residuals from
:class:`fairseq_sret.core.LearnableResidual`, as in the transformer models.
"""

from dataclasses import dataclass, field, replace
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.fx
from torch import Tensor, nn

from ..core import DropPath, FeedForward, LearnableResidual, RecursionSchedule, RecursionSpec
from ..core.depth import DepthControl
from ..core.fold import FoldsLRC
from .conventions import (
    ClassifierConventions, build_on, check_global_pool, check_nll_ratio, feature_take_indices, pool_features,
)
from .legacy import translate_mixer
from .registry import image_cfg, register_model

Size = Union[int, Tuple[int, int]]


@dataclass
class MixerConfig:
    img_size: Size = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = field(default=768, metadata={"help": "hidden size C"})
    layers: int = field(default=12, metadata={"help": "unique (shared) Mixer layers"})
    recursions: int = field(
        default=2, metadata={"help": "applications each layer is built (and trained) with; set_depth chooses"
                                     " how many of them run"},
    )
    token_mlp_dim: int = field(default=384, metadata={"help": "D_S"})
    channel_mlp_dim: int = field(default=3072, metadata={"help": "D_C"})
    lrc: bool = True
    nll_ratio: float = field(
        default=0.0, metadata={"help": "hidden ratio of an NLL after each application (0: none, the paper's)"}
    )
    norm_eps: float = 1e-6
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    global_pool: str = field(
        default="avg", metadata={"help": "token pooling before the head: avg (the paper's), max, avgmax,"
                                         " or '' (none: the head is applied to every token)"},
    )


class MixerLayer(FoldsLRC, nn.Module):
    """Token mixing then channel mixing, each a pre-LN residual with LRC. (B, S, C) -> (B, S, C)."""

    def __init__(
        self, dim: int, seq_len: int, token_mlp_dim: int, channel_mlp_dim: int, lrc: bool = True,
        norm_eps: float = 1e-6, drop_rate: float = 0.0, drop_path: float = 0.0,
    ):
        super().__init__()
        self.token_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.token_mlp = FeedForward(seq_len, token_mlp_dim, "gelu", drop_rate)
        self.token_residual = LearnableResidual(lrc)
        self.channel_norm = nn.LayerNorm(dim, eps=norm_eps)
        self.channel_mlp = FeedForward(dim, channel_mlp_dim, "gelu", drop_rate)
        self.channel_residual = LearnableResidual(lrc)
        self.dropout = nn.Dropout(drop_rate)
        self.drop_path = DropPath(drop_path)

    def lrc_sublayers(self):
        """(LayerNorm, residual, last linear) per residual, in order (for ``core.fold_lrc``)."""
        return [
            (self.token_norm, self.token_residual, self.token_mlp.fc2),
            (self.channel_norm, self.channel_residual, self.channel_mlp.fc2),
        ]

    def forward(self, x: Tensor, recursion: int = 0) -> Tensor:
        """``recursion`` is accepted for :class:`Recursive`; every application is the same."""
        mixed = self.token_mlp(self.token_norm(x).transpose(1, 2)).transpose(1, 2)
        # the residual and the channel-mixing LayerNorm that reads it: one kernel where the
        # fused kernel runs (CUDA + Triton), else exactly residual then norm
        x, h = self.token_residual.forward_norm(x, self.drop_path(self.dropout(mixed)), self.channel_norm)
        mixed = self.channel_mlp(h)
        return self.channel_residual(x, self.drop_path(self.dropout(mixed)))


class RecursiveMixer(ClassifierConventions, DepthControl, nn.Module):
    """MLP-Mixer whose layers are each applied ``recursions`` times. (B, 3, H, W) -> (B, classes).

    A timm model like :class:`~fairseq_sret.vision.SReT` (``docs/vision.md``); its
    intermediates are the outputs of the shared layers (after their last application), as
    maps (B, C, H/16, W/16). The token-mixing MLP fixes the input size.
    """

    def __init__(
        self, cfg: Optional[MixerConfig] = None, *, device: Optional[Union[str, torch.device]] = None,
        dtype: Optional[torch.dtype] = None, **kwargs,
    ):
        super().__init__()
        cfg = replace(cfg or MixerConfig(), **translate_mixer(kwargs))
        size = (cfg.img_size, cfg.img_size) if isinstance(cfg.img_size, int) else tuple(cfg.img_size)
        if min(size) < cfg.patch_size or size[0] % cfg.patch_size or size[1] % cfg.patch_size:
            raise ValueError(f"img_size {size} must be a positive multiple of patch_size {cfg.patch_size}")
        if cfg.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0: no classifier), got {cfg.num_classes}")
        cfg = replace(cfg, img_size=size, global_pool=check_global_pool(cfg.global_pool))
        self.cfg = cfg
        self.grid = (size[0] // cfg.patch_size, size[1] // cfg.patch_size)
        seq_len = self.grid[0] * self.grid[1]
        self.in_chans = cfg.in_chans
        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = cfg.embed_dim
        self.feature_info = [
            dict(num_chs=cfg.embed_dim, reduction=cfg.patch_size, module=f"blocks.{i}") for i in range(cfg.layers)
        ]
        check_nll_ratio(cfg.nll_ratio)
        recursion = RecursionSpec(embed_dim=cfg.embed_dim, schedule=RecursionSchedule.parse(cfg.recursions),
                                  nll_ratio=cfg.nll_ratio, lrc=cfg.lrc, norm_eps=cfg.norm_eps)
        with build_on(device):
            self.stem = nn.Conv2d(cfg.in_chans, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_size)
            self.blocks = nn.ModuleList(
                recursion.apply(MixerLayer(
                    cfg.embed_dim, seq_len, cfg.token_mlp_dim, cfg.channel_mlp_dim, lrc=cfg.lrc,
                    norm_eps=cfg.norm_eps, drop_rate=cfg.drop_rate,
                    drop_path=cfg.drop_path_rate * i / max(cfg.layers - 1, 1),
                ))
                for i in range(cfg.layers)
            )
            self.norm = nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)
            self.head = nn.Linear(cfg.embed_dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        if dtype is not None:
            self.to(dtype=dtype)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return set()

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """Parameter groups in depth order (layer-wise learning-rate decay): the stem, each shared
        layer, the final norm with the last layer; the head last."""
        return dict(stem=r"^stem", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    def _tokens(self, x: Tensor) -> Tensor:
        return self.stem(_check_input(x, self.cfg.in_chans, self.cfg.img_size)).flatten(2).transpose(1, 2)

    def forward_features(self, x: Tensor) -> Tensor:
        """(B, in_chans, H, W) -> normalised tokens (B, S, C)."""
        x = self._tokens(x)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens (B, S, C) -> pooled (B, C) -> head; with ``global_pool=''`` per token (B, S, ...)."""
        if self.global_pool:
            x = pool_features(x, self.global_pool, (1,))
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self, x: Tensor, indices: Union[None, int, Sequence[int]] = None, norm: bool = False,
        stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False,
    ) -> Union[List[Tensor], Tuple[Tensor, List[Tensor]]]:
        """``forward_features`` that also returns the outputs of the shared layers ``indices``
        (None: all, an int n: the last n, or a sequence) as maps (``NCHW`` or ``NHWC``);
        ``norm``: through the final LayerNorm; ``stop_early``: no layer after the last one
        returned. Returns the intermediates, or (final normalised tokens, intermediates)."""
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        take, last_taken = feature_take_indices(len(self.blocks), indices)
        intermediates = []
        x = self._tokens(x)
        for i, block in enumerate(self.blocks[: last_taken + 1] if stop_early else self.blocks):
            x = block(x)
            if i in take:
                feature = (self.norm(x) if norm else x).unflatten(1, self.grid)  # (B, h, w, C)
                intermediates.append(feature if output_fmt == "NHWC" else feature.permute(0, 3, 1, 2))
        return intermediates if intermediates_only else (self.norm(x), intermediates)

    def prune_intermediate_layers(
        self, indices: Union[int, Sequence[int]] = 1, prune_norm: bool = False, prune_head: bool = True,
    ) -> List[int]:
        """Remove the layers after the last of ``indices`` (and the head, the final LayerNorm if
        asked: timm's API for backbones); returns the indices as absolute layer numbers."""
        take, last_taken = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: last_taken + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take


def _check_input(x: Tensor, in_chans: int, img_size: Tuple[int, int]) -> Tensor:
    if x.dim() != 4 or tuple(x.shape[1:]) != (in_chans, *img_size):
        raise ValueError(
            f"expected input (B, {in_chans}, {img_size[0]}, {img_size[1]})"
            f" (the token-mixing MLP fixes the resolution), got {tuple(x.shape)}"
        )
    return x


# a torch.fx trace records the check as a call, made when the graph runs
torch.fx.wrap("_check_input")


def _cfg(paper_name: str, paper_ids: str) -> dict:
    """The pretrained config of the Mixers: 224 pixels (fixed), ImageNet normalisation."""
    return image_cfg(224, pool_size=(14, 14), first_conv="stem", classifier="head", fixed_input_size=True,
                     license="mit", paper_name=paper_name, paper_ids=paper_ids)


@register_model(pretrained_cfg=_cfg("MLP-Mixer: An all-MLP Architecture for Vision", "arXiv:2105.01601"))
def mixer_b16(**kwargs) -> RecursiveMixer:
    """Mixer-B/16 baseline: 12 layers applied once, plain residuals (59.9M parameters)."""
    return RecursiveMixer(**{**dict(recursions=1, lrc=False), **kwargs})


@register_model(pretrained_cfg=_cfg("Sliced Recursive Transformer", "arXiv:2111.05297"))
def recursive_mixer_b16(**kwargs) -> RecursiveMixer:
    """Mixer-B/16 + recursion + LRC (the paper's all-MLP SReT): each of the 12 layers applied twice."""
    return RecursiveMixer(**{**dict(recursions=2, lrc=True), **kwargs})
