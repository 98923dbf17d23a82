"""Fold the LRC coefficients into neighbouring weights for inference.

A layer with LRC computes, per residual sub-layer ``i`` (paper Eq. 7-8),

    pre-LN:   x_i = s_i * x_{i-1} + b_i * L_i(g_i(N_i(x_{i-1})))
    post-LN:  x_i = N_i(s_i * x_{i-1} + b_i * L_i(g_i(x_{i-1})))

where ``L_i`` is the branch's last linear layer (attention ``out_proj``, FFN ``fc2``, NLL
``mlp.fc2``, Mixer ``token_mlp.fc2`` / ``channel_mlp.fc2``) and ``N_i`` a LayerNorm.
:func:`fold_lrc` returns a copy in which

- every **branch scale** ``b_i`` is multiplied into ``L_i``'s weight and bias. The LRC
  coefficients of a shared layer are shared by all its applications, exactly like ``L_i``,
  so this is the same function for every application and no weight is duplicated;
- the **skip scales** are folded where a LayerNorm reads the stream, using
  ``LN_eps(c * u) = sign(c) * normalize_{eps / c^2}(u) * w + bias`` for any ``c != 0``:

  * pre-LN: inside a layer the stored stream after sub-layer ``i`` is the true one divided
    by ``P_i = s_1 ... s_i``; the next LayerNorm gets ``eps / P_i^2`` (and ``-w`` when
    ``P_i < 0``), ``L_i`` gets ``b_i / P_i``, and the residual becomes a plain ``x + f``.
    The layer's last residual keeps one constant factor, ``P_n * x + f`` (one kernel, the
    factor a Python float), so that every layer starts and ends at the true scale: a shared
    layer is re-applied, and a factor carried from one application into the next would have
    to differ per application, which a shared weight cannot hold. Each NLL is such a layer
    of one sub-layer (``s * x + f``);
  * post-LN: ``N_i(s_i * x + b_i * f) = N_i'(x + (b_i / s_i) * f)`` with ``eps / s_i^2``
    and ``sign(s_i) * w``: every residual becomes ``x + f``.

Exactness: the folded model computes the same function in exact arithmetic, for either sign
of every scale (LayerNorm eps and weight sign are adjusted, not approximated); in floating
point the results differ by rounding (tested: float64 to 1e-10, float32 to 1e-4 relative on
SReT-T and the translation model). Where a skip scale is zero (no ``1 / P``), or a
LayerNorm without weight would need a sign flip, or the layer normalises its stream between
sub-layers (CCT's, ``normalize_stream_before_ffn``), that layer keeps its skip scales as
constants (``s_i * x + f``, one kernel each) and only the branch scales are folded.

After folding, every residual is one element-wise kernel (``x + f`` or ``a * x + f`` with a
constant ``a``), as in a transformer without LRC; with the fused Triton kernel it is part of
the LayerNorm kernel that follows. Modules with a normalisation that is constant at inference
fold it too, through their ``fold_norm_for_inference()`` (the vision stem's BatchNorm goes
into its convolution). The coefficients are no longer parameters, so the result is for
inference (it is returned in ``eval()`` mode).
"""

import copy
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from .residual import FoldedResidual, LearnableResidual

Sublayer = Tuple[Optional[nn.LayerNorm], nn.Module, nn.Linear]


def _owner_and_name(model: nn.Module, target: nn.Module) -> Tuple[nn.Module, str]:
    for module in model.modules():
        for name, child in module.named_children():
            if child is target:
                return module, name
    raise ValueError("residual module not found in the model")


def _scale_linear(linear: nn.Linear, factor: float) -> None:
    with torch.no_grad():
        linear.weight.mul_(factor)
        if linear.bias is not None:
            linear.bias.mul_(factor)


def _adjust_norm(norm: nn.LayerNorm, scale: float) -> None:
    """``norm`` now reads ``u`` where it read ``scale * u``."""
    norm.eps = norm.eps / (scale * scale)
    if scale < 0:
        with torch.no_grad():
            norm.weight.neg_()


def _shared_parameters(model: nn.Module) -> set:
    """ids of parameters that more than one module holds (tied weights)."""
    seen: Dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {k for k, n in seen.items() if n > 1}


def fold_lrc(model: nn.Module, skip: bool = True, inplace: bool = False) -> nn.Module:
    """A copy of ``model`` (in ``eval()`` mode) with its LRC coefficients folded (see the
    module docstring); ``skip=False`` folds only the branch scales. Modules that describe
    their residual sub-layers through ``lrc_sublayers()`` are folded (:class:`SReTBlock`,
    :class:`NonLinearProjection`, the vision Mixer layer); others are left unchanged.

    Returns the folded model; ``inplace=True`` folds ``model`` itself.
    """
    folded = model if inplace else copy.deepcopy(model)
    folded.eval()
    tied = _shared_parameters(folded)
    layers = [m for m in folded.modules() if hasattr(m, "lrc_sublayers")]
    replacements: List[Tuple[nn.Module, FoldedResidual]] = []
    for layer in layers:
        subs: List[Sublayer] = list(layer.lrc_sublayers())
        if not all(isinstance(res, LearnableResidual) and res.learnable for _, res, _ in subs):
            continue  # plain residuals (lrc=False) or already folded
        linears = [lin for _, _, lin in subs]
        if any(id(p) in tied for lin in linears for p in lin.parameters()):
            raise ValueError(f"cannot fold LRC into tied weights of {type(layer).__name__}")
        s = [float(res.skip_scale.detach()) for _, res, _ in subs]
        b = [float(res.branch_scale.detach()) for _, res, _ in subs]
        pre_ln = bool(getattr(layer, "normalize_before", True))
        # a stream normalised mid-layer (CCT's) is at true scale after its LayerNorm, which the
        # scale-carrying fold below does not model: such a layer folds its branch scales only
        if pre_ln and not getattr(layer, "normalize_stream_before_ffn", False):
            # the norms after the first read the stream at scale P_{i-1}
            scales = [1.0]
            for value in s[:-1]:
                scales.append(scales[-1] * value)
            norms = [norm for norm, _, _ in subs[1:]]
            ok = skip and all(p != 0.0 for p in scales) and all(
                isinstance(n, nn.LayerNorm) and (n.weight is not None or p > 0) for n, p in zip(norms, scales[1:])
            )
            if ok:
                for i, (norm, res, lin) in enumerate(subs):
                    if i > 0:
                        _adjust_norm(norm, scales[i])
                    last = i == len(subs) - 1
                    _scale_linear(lin, b[i] if last else b[i] / scales[i + 1])
                    replacements.append((res, FoldedResidual(scales[i] * s[i] if last else 1.0)))
                continue
        elif not pre_ln:
            ok = skip and all(
                value != 0.0 and isinstance(n, nn.LayerNorm) and (n.weight is not None or value > 0)
                for (n, _, _), value in zip(subs, s)
            )
            if ok:
                for (norm, res, lin), si, bi in zip(subs, s, b):
                    _adjust_norm(norm, si)
                    _scale_linear(lin, bi / si)
                    replacements.append((res, FoldedResidual(1.0)))
                continue
        # branch scales only
        for (_, res, lin), si, bi in zip(subs, s, b):
            _scale_linear(lin, bi)
            replacements.append((res, FoldedResidual(si)))
    for res, new in replacements:
        owner, name = _owner_and_name(folded, res)
        setattr(owner, name, new)
    for module in [m for m in folded.modules() if callable(getattr(m, "fold_norm_for_inference", None))]:
        module.fold_norm_for_inference()
    return folded


class FoldsLRC:
    """Mixin of the layers that describe their residual sub-layers (``lrc_sublayers()``):
    :meth:`reparameterize` folds the layer's own LRC coefficients in place. It is the hook that
    timm's ``reparameterize_model`` (and ``benchmark.py --reparam``, ``validate.py --reparam``)
    calls on every module that has it, as for RepVGG-style branches."""

    def reparameterize(self) -> None:
        """Fold this layer's LRC coefficients into its weights, in place, for inference
        (:func:`fold_lrc`; the layer is left in ``eval()`` mode, its coefficients are no longer
        parameters). A layer already folded is left as it is."""
        fold_lrc(self, inplace=True)
