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
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ..core import DropPath, FeedForward, LearnableResidual, NonLinearProjection, Recursive
from ..core.depth import DepthControl
from .registry import register_model

Size = Union[int, Tuple[int, int]]


@dataclass
class MixerConfig:
    img_size: Size = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = field(default=768, metadata={"help": "hidden size C"})
    depth: int = field(default=12, metadata={"help": "distinct (shared) Mixer layers"})
    recursions: int = field(default=2, metadata={"help": "applications of each layer"})
    token_mlp_dim: int = field(default=384, metadata={"help": "D_S"})
    channel_mlp_dim: int = field(default=3072, metadata={"help": "D_C"})
    lrc: bool = True
    nll_ratio: Optional[float] = field(
        default=None, metadata={"help": "add an NLL of this hidden ratio after each application (paper: none)"}
    )
    norm_eps: float = 1e-6
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0


class MixerLayer(nn.Module):
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


class RecursiveMixer(DepthControl, nn.Module):
    """MLP-Mixer whose layers are each applied ``recursions`` times. (B, 3, H, W) -> (B, classes)."""

    def __init__(self, cfg: Optional[MixerConfig] = None, **kwargs):
        super().__init__()
        cfg = replace(cfg or MixerConfig(), **kwargs)
        size = (cfg.img_size, cfg.img_size) if isinstance(cfg.img_size, int) else tuple(cfg.img_size)
        if min(size) < cfg.patch_size or size[0] % cfg.patch_size or size[1] % cfg.patch_size:
            raise ValueError(f"img_size {size} must be a positive multiple of patch_size {cfg.patch_size}")
        if cfg.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0: no classifier), got {cfg.num_classes}")
        cfg = replace(cfg, img_size=size)
        self.cfg = cfg
        self.grid = (size[0] // cfg.patch_size, size[1] // cfg.patch_size)
        seq_len = self.grid[0] * self.grid[1]
        self.num_classes = cfg.num_classes
        self.num_features = self.embed_dim = cfg.embed_dim
        self.stem = nn.Conv2d(cfg.in_chans, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_size)
        make_nll = None
        if cfg.nll_ratio is not None:
            def make_nll(_recursion):
                return NonLinearProjection(cfg.embed_dim, cfg.nll_ratio, lrc=cfg.lrc, norm_eps=cfg.norm_eps)
        self.blocks = nn.ModuleList(
            Recursive(
                MixerLayer(
                    cfg.embed_dim, seq_len, cfg.token_mlp_dim, cfg.channel_mlp_dim, lrc=cfg.lrc,
                    norm_eps=cfg.norm_eps, drop_rate=cfg.drop_rate,
                    drop_path=cfg.drop_path_rate * i / max(cfg.depth - 1, 1),
                ),
                cfg.recursions,
                make_nll=make_nll,
            )
            for i in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.embed_dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.embed_dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return set()

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool not in (None, "", "avg"):
            raise ValueError(f"the Mixer only supports average pooling, got global_pool={global_pool!r}")
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for block in self.blocks:
            block.checkpoint = enable

    def forward_features(self, x: Tensor) -> Tensor:
        """(B, in_chans, H, W) -> normalised tokens (B, S, C)."""
        if x.dim() != 4 or tuple(x.shape[1:]) != (self.cfg.in_chans, *self.cfg.img_size):
            raise ValueError(
                f"expected input (B, {self.cfg.in_chans}, {self.cfg.img_size[0]}, {self.cfg.img_size[1]})"
                f" (the token-mixing MLP fixes the resolution), got {tuple(x.shape)}"
            )
        x = self.stem(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        x = x.mean(dim=1)
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


@register_model
def mixer_b16(**kwargs) -> RecursiveMixer:
    """Mixer-B/16 baseline: 12 layers applied once, plain residuals (59.9M parameters)."""
    return RecursiveMixer(**{**dict(recursions=1, lrc=False), **kwargs})


@register_model
def recursive_mixer_b16(**kwargs) -> RecursiveMixer:
    """Mixer-B/16 + recursion + LRC (the paper's all-MLP SReT): each of the 12 layers applied twice."""
    return RecursiveMixer(**{**dict(recursions=2, lrc=True), **kwargs})
