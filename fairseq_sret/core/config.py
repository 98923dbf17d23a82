"""Run-time switches of :mod:`fairseq_sret.core`, all in one place (after timm's
``timm/layers/config.py``): getters and setters, one context manager, one
:func:`is_compiling`.

The switches (:class:`FastPaths`):

- ``lrc_one_op``: an LRC residual ``s * x + b * y`` as one ``addcmul`` with a lean backward
  (True), as the three-kernel expression (False), or :data:`LRC_ONE_OP_AUTO`: one ``addcmul``
  at inference everywhere, and the lean backward only for CPU tensors; tensors on other
  devices (CUDA) that need gradients take the three-kernel expression, whose autograd backward
  trained whole models faster on the GPUs measured (:mod:`.fused`);
- ``fused``: the Triton residual + LRC + LayerNorm kernel: :data:`FUSED_AUTO` (CUDA tensors
  under ``torch.compile`` or a CUDA-graph capture, where its per-call host cost is paid once;
  PyTorch in eager mode, faster there on the GPUs measured), :data:`FUSED_ON` (CUDA tensors,
  eager mode too), :data:`FUSED_OFF` (never) or :data:`FUSED_FORCE` (CPU tensors too: tests
  under ``TRITON_INTERPRET=1``) (:mod:`.fused`);
- ``grouped_one_kernel``: the longest sequence whose sliced attention runs as one masked
  kernel over the whole sequence instead of packed groups; None: the device's default
  (:data:`fairseq_sret.core.attention.ONE_KERNEL_MAX_LENGTH`), 0: never.
- ``one_query_attention``: how a decoding step's attention (one query per sequence, no
  dropout) is computed: :data:`ONE_QUERY_MATMUL` (the default: two matrix products and a
  softmax, as fairseq's own decoder does) or :data:`ONE_QUERY_SDPA`
  (``scaled_dot_product_attention``, as every other attention here). SDPA's kernels are built
  for many queries: on a GPU its memory-efficient kernel computes a whole tile of queries for
  the one, and cuDNN's attention (fp16/bf16) builds an execution graph for every new key and
  source length, which a beam search meets at every step and batch; on the CPU its flash
  kernel is no faster than the products (:mod:`.attention`);
- ``onednn_linear``: at inference on the CPU, linear layers (and the FFN's first layer with
  its activation) as oneDNN's linear, which adds the bias and applies the activation in the
  matrix product instead of separate passes over the output (:mod:`.linear`).

Modules read the switches they use once, when they are built, into their own attributes (as
timm's layers do): their forward passes read no global. :func:`set_fast_paths` and
:func:`fast_paths` change the switches process-wide, for modules built later and for every
module already built (each follows the changes: :func:`follow_fast_paths`), so that
benchmarks and tests compare the paths on one model in one process (``with
fast_paths(grouped_one_kernel=0): ...``); :func:`apply_fast_paths` changes one built model's
modules alone (until the next process-wide change). They pick between equal computations: no
parameters or buffers depend on them, and ``torch.compile`` guards on the modules' attributes.
The modules that follow them: :class:`~fairseq_sret.core.attention.SlicedGroupAttention`
(``grouped_one_kernel``, ``one_query_attention``). ``lrc_one_op``, ``fused`` and
``onednn_linear`` are read by the functions :func:`~fairseq_sret.core.fused.lrc_add`,
:func:`~fairseq_sret.core.fused.lrc_add_norm` and :func:`~fairseq_sret.core.linear.linear`,
which fairseq's own layers call as well, each time they run.
"""

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator, Optional, Union

import torch
import torch.fx

FUSED_AUTO, FUSED_ON, FUSED_OFF, FUSED_FORCE = "auto", "on", "off", "force"
FUSED_MODES = (FUSED_AUTO, FUSED_ON, FUSED_OFF, FUSED_FORCE)
LRC_ONE_OP_AUTO = "auto"
ONE_QUERY_MATMUL, ONE_QUERY_SDPA = "matmul", "sdpa"
ONE_QUERY_MODES = (ONE_QUERY_MATMUL, ONE_QUERY_SDPA)


@dataclass(frozen=True)
class FastPaths:
    """The run-time choices of the fast paths (see the module docstring)."""

    lrc_one_op: Union[bool, str] = LRC_ONE_OP_AUTO
    fused: str = FUSED_AUTO
    grouped_one_kernel: Optional[int] = None
    one_query_attention: str = ONE_QUERY_MATMUL
    onednn_linear: bool = True


_FAST = FastPaths()
#: the built modules that read switches (``read_fast_paths``), told of every change
_FOLLOWERS: "weakref.WeakSet" = weakref.WeakSet()


def get_fast_paths() -> FastPaths:
    """The current choices."""
    return _FAST


def _changed(paths: FastPaths, changes: dict) -> FastPaths:
    """``paths`` with ``changes`` (checked: ValueError naming the switch, TypeError for an unknown one)."""
    if "fused" in changes and changes["fused"] not in FUSED_MODES:
        raise ValueError(f"fused must be one of {FUSED_MODES}, got {changes['fused']!r}")
    if "lrc_one_op" in changes and changes["lrc_one_op"] not in (True, False, LRC_ONE_OP_AUTO):
        raise ValueError(f"lrc_one_op must be True, False or {LRC_ONE_OP_AUTO!r}, got {changes['lrc_one_op']!r}")
    if "one_query_attention" in changes and changes["one_query_attention"] not in ONE_QUERY_MODES:
        raise ValueError(f"one_query_attention must be one of {ONE_QUERY_MODES}, "
                         f"got {changes['one_query_attention']!r}")
    return replace(paths, **changes)


def set_fast_paths(**changes) -> FastPaths:
    """Change the choices process-wide (``set_fast_paths(fused="off")``), for modules built
    later and every module already built; returns the previous ones."""
    global _FAST
    previous, _FAST = _FAST, _changed(_FAST, changes)
    for module in list(_FOLLOWERS):
        module.read_fast_paths(_FAST)
    return previous


def follow_fast_paths(module, read_now: bool = True) -> None:
    """Called by a module that uses switches, when it is built: ``module.read_fast_paths(paths)``
    reads the current ones now (``read_now``; a copy keeps those of its original) and at every
    process-wide change. The module is held weakly."""
    _FOLLOWERS.add(module)
    if read_now:
        module.read_fast_paths(_FAST)


def apply_fast_paths(model, **changes) -> FastPaths:
    """Change the switches of one built model: every module of ``model`` (an ``nn.Module``)
    that reads switches takes the process-wide choices with ``changes``, which are returned
    (``apply_fast_paths(model, grouped_one_kernel=0)``; ``apply_fast_paths(model)``: back to the
    process-wide ones). Other models keep theirs."""
    paths = _changed(_FAST, changes)
    for module in model.modules():
        read = getattr(module, "read_fast_paths", None)
        if callable(read):
            read(paths)
    return paths


@contextmanager
def fast_paths(**changes) -> Iterator[FastPaths]:
    """``with fast_paths(fused="off"): ...``: the choices for the duration of the block."""
    previous = set_fast_paths(**changes)
    try:
        yield _FAST
    finally:
        set_fast_paths(**vars(previous))


def is_compiling() -> bool:
    """True while ``torch.compile`` or ``torch.export`` (the ONNX exporter) traces: tensor
    values are unknown, so nothing may be read from a tensor, and paths that pay off only
    in eager mode give way to what the compiler fuses itself."""
    return torch.compiler.is_compiling()


def is_fx_tracing() -> bool:
    """True while ``torch.fx`` symbolically traces a module (timm's and torchvision's feature
    extraction, ``torch.fx.symbolic_trace``): tensors are proxies without a shape, device or
    value, so no Python decision may read one. Code that must decide on them is a function
    that the trace records as one call (``torch.fx.wrap``) and that decides when the graph runs."""
    return torch.fx._symbolic_trace.is_fx_symbolic_tracing()


def is_exporting() -> bool:
    """True while ``torch.export`` (the ONNX exporter) traces: the exported program must hold
    only standard operators, so custom kernels give way to their PyTorch definition."""
    return torch.compiler.is_exporting()


def is_capturing_cuda_graph(device) -> bool:
    """True while a CUDA graph is being captured on ``device``'s current stream: what runs is
    recorded, not executed, so nothing may be read back, cached or checked by running it."""
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()
