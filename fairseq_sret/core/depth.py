"""Depth on demand: run a model's recursive layers at a chosen depth, and the terms of
mixed-depth training.

A layer built (and trained) with ``N`` recursions can run only its first ``d <= N``
applications (:meth:`Recursive.set_depth`); the later applications and their NLLs are
skipped. :func:`set_depth` and :func:`at_depth` do that for every :class:`Recursive` inside
a module (a vision model, a translation encoder or decoder).

Mixed-depth training (paper, "Landscape Visualizations of DeiT and Our Mixed-depth SReT")
trains the full-depth network and shallower networks that re-use its weights, from the
same stem, in one step: an explicit deep supervision. The loss is
``L(full depth) + sum_k w_k L(depth d_k)``. The terms come from one option, parsed by
:func:`parse_mixed_depth` and checked against the model by :func:`check_mixed_depth`::

    --mixed-depth 1:0.5          depth 1 (every side), weight 0.5
    --mixed-depth 1:0.3,2:0.5    two shallower depths
    --mixed-depth 1              weight 1 (the paper sums the branches' losses)
    --mixed-depth 1/2:0.5        translation: encoder depth 1, decoder depth 2
"""

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ContextManager, Iterator, List, Optional, Sequence, Tuple

from torch import nn

from .recursion import Recursive


def recursive_layers(module: nn.Module) -> List[Recursive]:
    """Every :class:`Recursive` inside ``module`` (``module`` itself included)."""
    return [m for m in module.modules() if isinstance(m, Recursive)]


def built_recursions(module: nn.Module) -> int:
    """The recursions every recursive layer of ``module`` was built with (the smallest, if
    they differ: the deepest depth all of them can run). ValueError if it has none."""
    layers = recursive_layers(module)
    if not layers:
        raise ValueError(f"{type(module).__name__} has no recursive layers: its depth cannot be chosen")
    return min(layer.recursions for layer in layers)


def current_depth(module: nn.Module) -> int:
    """How many applications the recursive layers of ``module`` run (the largest, if they differ)."""
    layers = recursive_layers(module)
    if not layers:
        raise ValueError(f"{type(module).__name__} has no recursive layers")
    return max(layer.depth for layer in layers)


def check_depth(module: nn.Module, depth: Optional[int], name: str = "depth") -> None:
    """ValueError naming ``name`` unless every recursive layer of ``module`` can run at
    ``depth`` (None: all applications)."""
    built = built_recursions(module)
    if depth is None:
        return
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {depth!r}")
    if depth > built:
        raise ValueError(
            f"{name}={depth} is larger than the {built} recursions the layers were built (and"
            f" trained) with; use a depth from 1 to {built}"
        )


def set_depth(module: nn.Module, depth: Optional[int], name: str = "depth") -> None:
    """Run the first ``depth`` applications of every recursive layer in ``module`` (None:
    all of them). Checked before anything changes; errors name the value as ``name``."""
    check_depth(module, depth, name)
    for layer in recursive_layers(module):
        layer.set_depth(depth)


@contextmanager
def at_depth(module: nn.Module, depth: Optional[int], name: str = "depth") -> Iterator[nn.Module]:
    """Temporarily run ``module``'s recursive layers at ``depth`` (see :func:`set_depth`);
    every layer gets its previous depth back on exit."""
    saved = [(layer, layer.schedule) for layer in recursive_layers(module)]
    set_depth(module, depth, name=name)
    try:
        yield module
    finally:
        for layer, schedule in saved:
            layer.schedule = schedule


class DepthControl:
    """Depth on demand for a model whose recursive layers all share one depth (the vision
    models): ``recursions``, ``depth``, ``set_depth`` and ``at_depth`` as methods."""

    @property
    def recursions(self) -> int:
        """Applications every recursive layer was built (and trained) with."""
        return built_recursions(self)

    @property
    def depth(self) -> int:
        """Applications of every recursive layer that run (:meth:`set_depth`)."""
        return current_depth(self)

    def set_depth(self, depth: Optional[int]) -> None:
        """Run the first ``depth`` applications of every recursive layer (None: all); the
        later applications and their NLLs are skipped, every other module is shared."""
        set_depth(self, depth)

    def at_depth(self, depth: Optional[int]) -> ContextManager[nn.Module]:
        """Temporarily run at ``depth`` (see :meth:`set_depth`)."""
        return at_depth(self, depth)


@dataclass(frozen=True)
class DepthTerm:
    """One shallower network of mixed-depth training: its depth per side and loss weight."""

    depths: Tuple[int, ...]
    weight: float = 1.0

    @property
    def label(self) -> str:
        """``"1"`` (one depth for every side) or ``"1_2"`` (encoder 1, decoder 2): metric names
        are ``loss_depth<label>``."""
        if len(set(self.depths)) == 1:
            return str(self.depths[0])
        return "_".join(map(str, self.depths))


def parse_mixed_depth(value, sides: int = 1, option: str = "--mixed-depth") -> Tuple[DepthTerm, ...]:
    """``"1:0.5,2:0.25"`` -> terms; ``""``/None -> no term (plain training).

    Each comma-separated term is ``DEPTH[:WEIGHT]`` (weight 1 when omitted). With ``sides=2``
    (translation) ``DEPTH`` is one depth for encoder and decoder or ``ENC/DEC``. Errors are
    ValueErrors naming ``option``.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return ()
    if not isinstance(value, str):
        raise ValueError(f"{option} must be a string such as '1:0.5', got {value!r}")
    terms = []
    for text in value.split(","):
        text = text.strip()
        depth_text, sep, weight_text = text.partition(":")
        form = "ENC/DEC or DEPTH" if sides == 2 else "DEPTH"
        if not depth_text or (sep and not weight_text):
            raise ValueError(f"{option}: each term is {form}[:WEIGHT], e.g. '1:0.5'; got {text!r} in {value!r}")
        parts = depth_text.split("/")
        if len(parts) not in (1, sides):
            raise ValueError(
                f"{option}: {depth_text!r} gives {len(parts)} depths; give one depth"
                + (" or one per side (ENC/DEC)" if sides > 1 else "") + f" (in {value!r})"
            )
        try:
            depths = tuple(int(p) for p in parts)
        except ValueError:
            raise ValueError(f"{option}: depths must be integers, got {depth_text!r} in {value!r}") from None
        if any(d < 1 for d in depths):
            raise ValueError(f"{option}: depths must be >= 1, got {depth_text!r} in {value!r}")
        try:
            weight = float(weight_text) if sep else 1.0
        except ValueError:
            raise ValueError(f"{option}: the weight must be a number, got {weight_text!r} in {value!r}") from None
        if not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"{option}: weights must be finite and > 0, got {weight_text!r} in {value!r}")
        term = DepthTerm(depths * sides if len(depths) == 1 else depths, weight)
        if any(t.depths == term.depths for t in terms):
            raise ValueError(f"{option}: depth {depth_text!r} is listed twice in {value!r}")
        terms.append(term)
    return tuple(terms)


def check_mixed_depth(
    terms: Sequence[DepthTerm], recursions: Sequence[int], sides: Sequence[str] = ("the model",),
    option: str = "--mixed-depth",
) -> None:
    """Every term must fit the recursions the model was built with (``recursions[i]`` for
    side ``sides[i]``) and be shallower than the full depth somewhere (the full-depth loss is
    always included)."""
    full = tuple(recursions)
    for term in terms:
        for depth, built, side in zip(term.depths, full, sides):
            if depth > built:
                raise ValueError(
                    f"{option}: depth {depth} is larger than the {built} recursions {side} was built with;"
                    f" use depths from 1 to {built}"
                )
        if term.depths == full:
            raise ValueError(
                f"{option}: depth {term.label.replace('_', '/')} is the full depth, whose loss is always"
                " included; list only shallower depths"
            )
