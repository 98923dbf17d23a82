"""Residual + LRC (+ LayerNorm) as one operation.

An LRC residual is ``res = skip_scale * x + branch_scale * y`` (paper Eq. 7-8), and in a
pre-LN layer the next sub-layer's LayerNorm reads ``res`` right away. This module computes
both, in the shape of FlashAttention's ``ops/triton/layer_norm.py`` (``prenorm=True``):

- :func:`lrc_add_ref` and :func:`lrc_add_norm_ref` are the definition (plain PyTorch);
- :func:`lrc_add` and :func:`lrc_add_norm` are what the modules call. They pick, at run time:

  * the Triton kernels (:mod:`._triton_kernels`: one kernel forward, one backward, plus
    tiny reductions for the parameter gradients) for CUDA tensors of rows up to
    :data:`MAX_FUSED_WIDTH` when Triton is importable and without module hooks on the
    LayerNorm, under ``torch.compile`` (they are ``torch.library`` operators the compiler
    keeps; not under ``torch.export``) and while a CUDA graph is captured. Not in eager
    mode by default: there each call's host time (the op's dispatch and Triton's launch of a
    kernel with ~30 arguments) exceeds the GPU work it saves at SReT's sizes
    (docs/benchmarks/vision.md, the GPU table);
    ``fast_paths(fused="on")`` uses them in eager mode too;
  * otherwise PyTorch: ``torch.addcmul(skip_scale * x, branch_scale, y)``, two element-wise
    kernels instead of three (the same products and sum; addcmul rounds ``b * y + s * x``
    once where the three-kernel form rounds twice), with a backward of two multiplies and
    two dot products (:class:`_LRCAdd`) when gradients are needed (CPU tensors; CUDA tensors
    that need gradients take the three-kernel expression and autograd's backward, which
    trained faster on the GPUs measured: docs/benchmarks/fast_paths.md), then the LayerNorm
    module.

Scales are a one-element tensor (a learnable LRC coefficient, gradients flow to it), a
Python float (a constant, e.g. after :func:`fairseq_sret.core.fold_lrc`) or None (1).

:func:`fairseq_sret.core.config.fast_paths` switches the choices (benchmarks measure
before/after in one process): ``lrc_one_op=False`` restores the three-kernel
``skip_scale * x + branch_scale * y``, ``lrc_one_op=True`` takes the lean backward on every
device; ``fused="off"`` never uses Triton, ``"on"`` uses it in
eager mode too, ``"force"`` for CPU tensors too (tests, under ``TRITON_INTERPRET=1``). Triton stays optional
(``pip install fairseq-sret[kernels]``).
"""

import functools
import os
import warnings
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _hooks

from ..environment import switched_on
from .config import (
    FUSED_AUTO, FUSED_FORCE, FUSED_OFF, LRC_ONE_OP_AUTO, get_fast_paths, is_capturing_cuda_graph, is_compiling,
    is_exporting, is_fx_tracing,
)

Scale = Union[None, float, Tensor]

#: The widest rows the Triton kernels take (one program holds a whole row); wider: PyTorch.
MAX_FUSED_WIDTH = 8192


# ----------------------------------------------------------------------------- definition
def lrc_add_ref(x: Tensor, y: Tensor, skip_scale: Scale = None, branch_scale: Scale = None) -> Tensor:
    """Definition: ``skip_scale * x + branch_scale * y`` (None = 1)."""
    if skip_scale is not None:
        x = skip_scale * x
    if branch_scale is not None:
        y = branch_scale * y
    return x + y


def lrc_add_norm_ref(
    x: Tensor, y: Tensor, skip_scale: Scale, branch_scale: Scale,
    weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
) -> Tuple[Tensor, Tensor]:
    """Definition: ``res = lrc_add_ref(...)``; returns ``(res, layer_norm(res))`` over the last dim."""
    res = lrc_add_ref(x, y, skip_scale, branch_scale)
    return res, F.layer_norm(res, res.shape[-1:], weight, bias, eps)


# ----------------------------------------------------------------------------- PyTorch path
class _LRCAdd(torch.autograd.Function):
    """``addcmul(s * x, b, y)`` with a lean backward: ``dx = g * s``, ``dy = g * b`` and the
    scale gradients as dot products ``<g, x>``, ``<g, y>`` (no full-size temporaries).
    Autograd's own backward of the same expression materialises ``g * x`` and ``g * y`` for
    the reductions, and addcmul's adds a multiply of ``y`` by its ``value`` (4 extra passes).
    x, y: same shape; s, b: one-element tensors."""

    @staticmethod
    def forward(ctx, x, y, s, b):
        need = ctx.needs_input_grad
        ctx.save_for_backward(x if need[2] else None, y if need[3] else None, s, b)
        return torch.addcmul(s * x, b, y)

    @staticmethod
    def backward(ctx, g):
        x, y, s, b = ctx.saved_tensors
        need = ctx.needs_input_grad
        # a strided g (a pooled map's gradient reaching the last stage's tokens) is copied once
        # here; dx and dy then hand every earlier residual and linear layer a dense gradient,
        # where each would otherwise copy it again to flatten it
        g = g.contiguous()
        dx = g * s if need[0] else None  # autograd casts to the input's dtype where they differ
        dy = g * b if need[1] else None
        flat = g.reshape(-1)
        ds = torch.dot(flat, x.reshape(-1).to(flat.dtype)).reshape(s.shape).to(s.dtype) if need[2] else None
        db = torch.dot(flat, y.reshape(-1).to(flat.dtype)).reshape(b.shape).to(b.dtype) if need[3] else None
        return dx, dy, ds, db


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def _lrc_add_torch(x: Tensor, y: Tensor, skip_scale: Scale, branch_scale: Scale) -> Tensor:
    if skip_scale is None and branch_scale is None:
        return x + y
    one_op = get_fast_paths().lrc_one_op
    if not one_op:
        return lrc_add_ref(x, y, skip_scale, branch_scale)
    training = _needs_grad(x, y, skip_scale, branch_scale)
    if training and one_op == LRC_ONE_OP_AUTO and x.device.type != "cpu" and not is_compiling():
        return lrc_add_ref(x, y, skip_scale, branch_scale)
    if (
        training and isinstance(skip_scale, Tensor) and isinstance(branch_scale, Tensor)
        and not is_compiling() and x.shape == y.shape and skip_scale.numel() == branch_scale.numel() == 1
    ):
        return _LRCAdd.apply(x, y, skip_scale, branch_scale)
    if isinstance(branch_scale, Tensor):
        if skip_scale is not None:
            x = skip_scale * x
        return torch.addcmul(x, branch_scale, y)
    if isinstance(skip_scale, Tensor):  # branch_scale a constant or None
        if branch_scale is not None:
            y = branch_scale * y
        return torch.addcmul(y, skip_scale, x)
    # constants only (a folded model): y + a * x in one kernel
    if branch_scale is not None:
        y = branch_scale * y
    return y + x if skip_scale is None or skip_scale == 1.0 else torch.add(y, x, alpha=skip_scale)


# ----------------------------------------------------------------------------- dispatch
@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """True when Triton imports and can run: on CUDA, or on the CPU under ``TRITON_INTERPRET=1``
    (set before the first call). ``SRET_DISABLE_TRITON=1`` turns it off."""
    if switched_on("SRET_DISABLE_TRITON"):
        return False
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return False
    try:
        from . import _triton_kernels  # noqa: F401
    except Exception:
        return False
    return True


_KERNEL_OK = {}


def _kernels_work(device: torch.device) -> bool:
    """Run the kernels once on ``device`` (forward and backward of a small case, against the
    definition) before first use; on any error or mismatch warn and use PyTorch instead.
    Never inside a CUDA-graph capture (the check would be captured): there, before the check
    has run, PyTorch is used."""
    key = (device.type, device.index)
    if key in _KERNEL_OK:
        return _KERNEL_OK[key]
    if is_capturing_cuda_graph(device):
        return False
    ok = False
    try:
        from ._triton_kernels import lrc_add_norm_triton

        with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
            g = torch.Generator(device="cpu").manual_seed(0)
            x, y = (torch.randn(5, 40, generator=g).to(device).requires_grad_() for _ in range(2))
            s, b = (torch.tensor([v], device=device, requires_grad=True) for v in (0.7, -1.3))
            w, bias = (torch.randn(40, generator=g).to(device).requires_grad_() for _ in range(2))
            got = lrc_add_norm_triton(x, y, s, b, w, bias, 1e-5, norm=True)
            want = lrc_add_norm_ref(x, y, s, b, w, bias, 1e-5)
            leaves = (x, y, s, b, w, bias)
            grads = [torch.ones_like(t) for t in want]
            ok = all(torch.allclose(a, r, rtol=1e-4, atol=1e-4) for a, r in zip(got, want)) and all(
                torch.allclose(a, r, rtol=1e-3, atol=1e-3)
                for a, r in zip(torch.autograd.grad(got, leaves, grads), torch.autograd.grad(want, leaves, grads))
            )
        if not ok:
            warnings.warn("fairseq_sret: the Triton residual+LayerNorm kernel disagrees with PyTorch on "
                          f"{device}; using PyTorch")
    except Exception as err:  # a Triton/driver problem must not stop the model
        warnings.warn(f"fairseq_sret: the Triton residual+LayerNorm kernel failed on {device} "
                      f"({type(err).__name__}: {err}); using PyTorch")
    _KERNEL_OK[key] = ok
    return ok


def _no_hooks(module: Optional[nn.Module]) -> bool:
    if module is None:
        return True
    return not (
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
        or _hooks._global_forward_hooks or _hooks._global_forward_pre_hooks or _hooks._global_backward_hooks
    )


def _kernel_device(x: Tensor, mode: str) -> bool:
    """CUDA tensors; any device in ``force`` mode."""
    return x.device.type == "cuda" or mode == FUSED_FORCE


def _use_triton(x: Tensor, y: Tensor, norm: Optional[nn.LayerNorm] = None) -> bool:
    mode = get_fast_paths().fused
    if mode == FUSED_OFF:
        return False
    if not _kernel_device(x, mode):
        return False
    if x.shape != y.shape or x.device != y.device or not (x.is_floating_point() and y.is_floating_point()):
        return False
    if x.dim() == 0 or x.numel() == 0 or x.size(-1) > MAX_FUSED_WIDTH:
        return False
    if norm is not None:
        if not isinstance(norm, nn.LayerNorm) or tuple(norm.normalized_shape) != (x.size(-1),):
            return False
        if not _no_hooks(norm):
            return False
    if is_compiling():
        # torch.compile keeps the kernel (a torch.library op) once its eager check has passed
        # on this device (the check runs kernels, which a trace cannot); an exported program
        # holds only standard operators
        return not is_exporting() and _KERNEL_OK.get((x.device.type, x.device.index), False)
    if not triton_available():
        return False
    if mode == FUSED_AUTO and not is_capturing_cuda_graph(x.device):
        # eager: the op's host cost per call exceeds what it saves (module docstring); the
        # self-check still runs once here, so that a later capture or compile can use it
        _kernels_work(x.device)
        return False
    return _kernels_work(x.device)


def fused_kernels_active(x: Tensor) -> bool:
    """Whether :func:`lrc_add_norm` can use the Triton kernel for tensors like ``x`` (device,
    mode, Triton); callers that must restructure to use it (chaining LayerNorms across
    modules) ask first and keep their plain code path otherwise. False while ``torch.fx``
    traces: a graph fixes the structure before it knows the device (its residuals still pick
    their kernel when it runs, see :class:`~fairseq_sret.core.LearnableResidual`)."""
    if is_fx_tracing():
        return False
    return _use_triton(x, x)


def lrc_add(x: Tensor, y: Tensor, skip_scale: Scale = None, branch_scale: Scale = None) -> Tensor:
    """``skip_scale * x + branch_scale * y``: one Triton kernel on CUDA, else two (or one) PyTorch ones."""
    if (skip_scale is not None or branch_scale is not None) and _use_triton(x, y):
        if all(not isinstance(s, Tensor) or (s.numel() == 1 and s.device == x.device) for s in (skip_scale, branch_scale)):
            from ._triton_kernels import lrc_add_norm_triton

            return lrc_add_norm_triton(x, y, skip_scale, branch_scale, None, None, 0.0, norm=False)
    return _lrc_add_torch(x, y, skip_scale, branch_scale)


def lrc_add_norm(
    x: Tensor, y: Tensor, skip_scale: Scale, branch_scale: Scale, norm: nn.LayerNorm
) -> Tuple[Tensor, Tensor]:
    """``res = skip_scale * x + branch_scale * y`` and ``norm(res)``; returns ``(res, norm(res))``.

    One Triton kernel (forward and backward) where :func:`_use_triton` allows it; otherwise
    :func:`lrc_add` followed by the LayerNorm module itself.
    """
    if _use_triton(x, y, norm) and all(
        not isinstance(s, Tensor) or (s.numel() == 1 and s.device == x.device) for s in (skip_scale, branch_scale)
    ):
        from ._triton_kernels import lrc_add_norm_triton

        return lrc_add_norm_triton(x, y, skip_scale, branch_scale, norm.weight, norm.bias, norm.eps, norm=True)
    res = _lrc_add_torch(x, y, skip_scale, branch_scale)
    return res, norm(res)
