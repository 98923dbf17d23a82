"""Depth on demand: run a model's recursive layers at a chosen depth.

A layer built (and trained) with ``N`` recursions can run only its first ``d <= N``
applications; the later applications and their NLLs are skipped, nothing is
re-initialised. This module is the one way to choose the depth:

- :func:`set_depth` and :func:`at_depth` set it for every :class:`Recursive` inside a
  module (one layer, a stack of layers, a translation encoder or decoder);
- :class:`DepthControl` gives a model the same as methods, with one depth for the whole
  model (vision: ``model.set_depth(1)``) or one per side (translation:
  ``model.set_depth(1, 2)`` for encoder and decoder).

Values are checked by :func:`fairseq_sret.core.schedule.check_depth` before anything changes.
"""

from contextlib import ExitStack, contextmanager
from typing import ContextManager, Dict, Iterator, List, Optional, Tuple, Union

from torch import nn

from .recursion import Recursive
from .schedule import RecursionSchedule, check_depth


def recursive_layers(module: nn.Module) -> List[Recursive]:
    """Every :class:`Recursive` inside ``module`` (``module`` itself included)."""
    return [m for m in module.modules() if isinstance(m, Recursive)]


def _layers(module: nn.Module) -> List[Recursive]:
    layers = recursive_layers(module)
    if not layers:
        raise ValueError(f"{type(module).__name__} has no recursive layers: its depth cannot be chosen")
    return layers


def recursions_of(module: nn.Module) -> int:
    """The recursions the recursive layers of ``module`` were built (and trained) with (the
    smallest, if they differ: the deepest depth all of them can run)."""
    return min(layer.recursions for layer in _layers(module))


def depth_of(module: nn.Module) -> int:
    """How many applications the recursive layers of ``module`` run (the largest, if they differ)."""
    return max(layer.depth for layer in _layers(module))


def _check(module: nn.Module, value: Optional[int], name: str) -> None:
    built = recursions_of(module)
    if value is not None:
        check_depth(value, built, name, built="the layers were built (and trained) with")


def set_depth(module: nn.Module, value: Optional[int], name: str = "depth") -> None:
    """Run the first ``value`` applications of every recursive layer in ``module`` (None:
    all of them). Checked before anything changes; errors name the value as ``name``."""
    _check(module, value, name)
    # layers that shared a schedule keep sharing one (torch.compile guards on the sharing:
    # a model back at a depth it ran before reuses that depth's graph)
    new: Dict[int, RecursionSchedule] = {}
    for layer in recursive_layers(module):
        old = layer.schedule
        if id(old) not in new:
            new[id(old)] = old.with_depth(value, name)
        layer.schedule = new[id(old)]


@contextmanager
def at_depth(module: nn.Module, value: Optional[int], name: str = "depth") -> Iterator[nn.Module]:
    """Temporarily run ``module``'s recursive layers at depth ``value`` (see :func:`set_depth`);
    every layer gets its previous depth back on exit."""
    saved = [(layer, layer.schedule) for layer in recursive_layers(module)]
    set_depth(module, value, name)
    try:
        yield module
    finally:
        for layer, schedule in saved:
            layer.schedule = schedule


class DepthControl:
    """Depth on demand as methods of a model (an ``nn.Module``).

    ``depth_sides`` names the sub-modules whose depths are chosen separately (a translation
    model: ``("encoder", "decoder")``); empty (the default), the model has one depth.
    :attr:`recursions` and :attr:`depth` are then ints, else tuples with one value per side;
    :meth:`set_depth` and :meth:`at_depth` take one depth per side, positionally or by side
    name (None: every trained application).
    """

    depth_sides: Tuple[str, ...] = ()

    def _depth_parts(self) -> List[Tuple[str, str, nn.Module]]:
        """(side, name in errors, module) for every side."""
        if not self.depth_sides:
            return [("depth", "depth", self)]
        return [(side, f"{side} depth", getattr(self, side)) for side in self.depth_sides]

    def _per_side(self, read) -> Union[int, Tuple[int, ...]]:
        values = tuple(read(module) for _, _, module in self._depth_parts())
        return values if self.depth_sides else values[0]

    def _chosen(self, depths, by_side) -> List[Tuple[str, nn.Module, Optional[int]]]:
        parts = self._depth_parts()
        sides = [side for side, _, _ in parts]
        unknown = sorted(set(by_side) - set(sides))
        if len(depths) > len(parts) or unknown:
            given = [repr(d) for d in depths] + [f"{k}={v!r}" for k, v in by_side.items()]
            wanted = f"one depth per side ({', '.join(sides)})" if self.depth_sides else "one depth"
            raise TypeError(f"{type(self).__name__} takes {wanted}, got {', '.join(given)}")
        values = list(depths) + [None] * (len(parts) - len(depths))
        chosen = [(name, module, by_side.get(side, value)) for (side, name, module), value in zip(parts, values)]
        for name, module, value in chosen:
            _check(module, value, name)
        return chosen

    @property
    def recursions(self) -> Union[int, Tuple[int, ...]]:
        """Applications every recursive layer was built (and trained) with (per side)."""
        return self._per_side(recursions_of)

    @property
    def depth(self) -> Union[int, Tuple[int, ...]]:
        """Applications of every recursive layer that run (per side)."""
        return self._per_side(depth_of)

    def set_depth(self, *depths: Optional[int], **by_side: Optional[int]) -> None:
        """Run the first ``depth`` applications of every recursive layer (per side; None:
        all). The later applications and their NLLs are skipped, every other module is
        shared. Every side is checked before any changes."""
        for name, module, value in self._chosen(depths, by_side):
            set_depth(module, value, name)

    def at_depth(self, *depths: Optional[int], **by_side: Optional[int]) -> ContextManager[nn.Module]:
        """Temporarily run at the given depths (see :meth:`set_depth`)."""
        chosen = self._chosen(depths, by_side)

        @contextmanager
        def scope():
            with ExitStack() as stack:
                for name, module, value in chosen:
                    stack.enter_context(at_depth(module, value, name))
                yield self

        return scope()
