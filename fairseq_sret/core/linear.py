"""Linear layers (with the activation that follows) for inference on the CPU.

PyTorch's CPU ``F.linear`` with a bias first copies the bias into every row of the output
and then accumulates the matrix product into it, and an activation is one more pass over
the output: at SReT-T's first stage (12,544 tokens of batch 16) each pass costs about as
much as the product. oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``, the operator
inductor uses for the same fusion) adds the bias and applies GELU or ReLU while writing
the product. :func:`linear` uses it where it computes the same function:

- CPU tensors of at least :data:`ONEDNN_MIN_ROWS` rows, float32 or bfloat16, input and
  weight of one dtype, no autocast, a plain weight (not one :mod:`.int8` quantized);
- no gradient (``torch.no_grad`` / ``inference_mode``: the operator has no backward);
- eager mode (``torch.compile`` does this fusion itself; exported programs keep standard
  operators), no hooks on the layer, and ``fast_paths(onednn_linear=True)`` (the default).

Everywhere else it is ``act(layer(x))``, which is also the definition the tests compare with.
"""

import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _hooks

from .config import get_fast_paths, is_compiling

#: the fewest rows (tokens) for which :func:`linear` uses oneDNN: below it the product is
#: short and oneDNN's per-call set-up costs more than the passes it saves (NMT decoding
#: steps have batch x beam rows; SReT-T's first stages thousands; docs/benchmarks/fast_paths.md)
ONEDNN_MIN_ROWS = 2048

#: activation name -> (oneDNN post-op, its algorithm) for the activations oneDNN fuses
_ONEDNN_ACTIVATIONS = {None: ("none", ""), "relu": ("relu", ""), "gelu": ("gelu", "none"),
                       "gelu_accurate": ("gelu", "tanh")}
#: the activation names :func:`linear` takes
FUSABLE_ACTIVATIONS = ("relu", "gelu", "gelu_accurate")
_REFERENCE_ACTIVATIONS = {None: lambda y: y, "relu": F.relu, "gelu": F.gelu,
                          "gelu_accurate": lambda y: F.gelu(y, approximate="tanh")}


@functools.lru_cache(maxsize=None)
def onednn_linear_available() -> bool:
    """oneDNN's linear exists in this torch build and agrees with ``F.linear`` (checked once)."""
    op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if op is None or not torch.backends.mkldnn.is_available():
        return False
    try:
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            g = torch.Generator().manual_seed(0)
            x, w, b = torch.randn(2, 3, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(5, generator=g)
            got = torch.ops.mkldnn._linear_pointwise(x, w, b, "gelu", [], "none")
            return torch.allclose(got, F.gelu(F.linear(x, w, b)), rtol=1e-4, atol=1e-5)
    except Exception:  # a build whose operator differs: use PyTorch's linear
        return False


@functools.lru_cache(maxsize=None)
def onednn_bf16_available() -> bool:
    """oneDNN runs bf16 on this processor (native bf16 or AVX-512): on others its bf16 linear
    fails to build a primitive, and PyTorch's linear is used."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check is not None and check())


def no_forward_hooks(layer: nn.Module) -> bool:
    """No forward (pre-)hook on ``layer`` nor a global one: a fast path that skips the
    module's call may run without hiding anything from a hook."""
    return not (layer._forward_hooks or layer._forward_pre_hooks or _hooks._global_forward_hooks
                or _hooks._global_forward_pre_hooks)


def has_plain_weight(layer: nn.Linear) -> bool:
    """The layer's weight is a plain tensor, not one that int8 quantization (:mod:`.int8`, or
    transformers' ``TorchAoConfig``) replaced: only a plain one can be read as a matrix by
    other operators, or sliced in every autograd mode."""
    return type(layer.weight) in (nn.Parameter, torch.Tensor)


def _use_onednn(x: Tensor, layer: nn.Linear) -> bool:
    # training, tracing (a size test would become a shape guard of torch.export) and short
    # inputs such as decoding steps are decided first
    if torch.is_grad_enabled() or is_compiling() or x.numel() < ONEDNN_MIN_ROWS * x.size(-1):
        return False
    weight = layer.weight
    return (
        get_fast_paths().onednn_linear and x.device.type == "cpu" and x.dim() >= 2
        and has_plain_weight(layer)
        and (x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and onednn_bf16_available()))
        and weight.dtype == x.dtype
        and (layer.bias is None or layer.bias.dtype == x.dtype) and x.is_contiguous()
        and not torch.is_autocast_enabled("cpu") and no_forward_hooks(layer) and onednn_linear_available()
    )


def linear(x: Tensor, layer: nn.Linear, activation: Optional[str] = None) -> Tensor:
    """``activation(layer(x))``: (..., in) -> (..., out); ``activation`` None, ``relu``,
    ``gelu`` or ``gelu_accurate`` (others: apply them to the result yourself)."""
    if activation not in _ONEDNN_ACTIVATIONS:
        raise ValueError(f"linear() fuses {sorted(k for k in _ONEDNN_ACTIVATIONS if k)} or None, got {activation!r}")
    if _use_onednn(x, layer):
        post_op, algorithm = _ONEDNN_ACTIVATIONS[activation]
        return torch.ops.mkldnn._linear_pointwise(x, layer.weight, layer.bias, post_op, [], algorithm)
    return _REFERENCE_ACTIVATIONS[activation](layer(x))
