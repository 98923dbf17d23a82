"""SReT's image layers: the stems, the pooling between stages, the recursive stage, and the
functions that move between images, feature maps and tokens (shared with
:mod:`fairseq_sret.vision.cct`).

Every attention-related module comes from :mod:`fairseq_sret.core` (the stage builds its
shared blocks from :class:`~fairseq_sret.core.SReTLayerSpec`), the same modules as the
translation models.
"""

from dataclasses import replace
from typing import Sequence, Tuple, Union

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from ...core import RecursionSchedule, RecursionSpec, SReTLayerSpec
from ...core.attention import DEFAULT_ATTENTION_LAYER
from ...core.linear import no_forward_hooks

Size = Union[int, Tuple[int, int]]


def _pair(size: Size) -> Tuple[int, int]:
    return (size, size) if isinstance(size, int) else tuple(size)


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
    ``nll_ratio=0``; ``schedule[r]`` sets the attention groups and partition of application
    ``r``. (B, C, H, W) -> (B, C, H, W); tokens are the pixels in row-major order, so contiguous
    slices are bands of rows. The output keeps the input's memory format
    (``torch.channels_last`` or contiguous). ``attention_layer``: the blocks' attention, a name
    registered with :func:`~fairseq_sret.core.attention.register_attention_layer`.
    """

    def __init__(
        self, dim: int, num_heads: int, num_blocks: int, schedule: RecursionSchedule,
        mlp_ratio: float, nll_ratio: float, drop_paths: Sequence[float],
        lrc: bool = True, norm_eps: float = 1e-6, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
        attention_layer: str = DEFAULT_ATTENTION_LAYER,
    ):
        super().__init__()
        recursion = RecursionSpec(
            embed_dim=dim, schedule=schedule, lrc=lrc, nll_ratio=nll_ratio, activation="gelu",
            dropout=drop_rate, activation_dropout=drop_rate, norm_eps=norm_eps,
        )
        layer = SReTLayerSpec(
            recursion=recursion, num_heads=num_heads, ffn_dim=int(dim * mlp_ratio), attention_dropout=attn_drop_rate,
            attention=attention_layer,
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
# torch.fx.wrap patches a name in the module that calls it: the model and CCT modules, which
# call the other two, wrap them too.
torch.fx.wrap("_tokens_to_map")


def resize_pos_embed(pos_embed: Tensor, size: Tuple[int, int]) -> Tensor:
    """Bicubic interpolation of a (1, C, h, w) position embedding to (1, C, *size)."""
    if tuple(pos_embed.shape[-2:]) == tuple(size):
        return pos_embed
    return F.interpolate(pos_embed, size=size, mode="bicubic", align_corners=False)
