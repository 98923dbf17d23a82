"""Mixed-depth training: the terms of the ``--mixed-depth`` option and the loss.

The paper's explicit mixed-depth training ("Landscape Visualizations of DeiT and Our
Mixed-depth SReT") trains the full-depth network and shallower networks that re-use its
weights, from the same stem, in one step: an explicit deep supervision. The loss is
``L(full depth) + sum_k w_k L(depth d_k)`` (:func:`mixed_depth_loss`), where depth ``d``
runs the first ``d`` applications of every shared layer (:mod:`fairseq_sret.core.depth`).
The terms come from one option, parsed by :func:`parse_mixed_depth` and checked against
the model by :func:`check_mixed_depth`::

    --mixed-depth 1:0.5          depth 1 (every side), weight 0.5
    --mixed-depth 1:0.3,2:0.5    two shallower depths
    --mixed-depth 1              weight 1 (the paper sums the branches' losses)
    --mixed-depth 1/2:0.5        translation: encoder depth 1, decoder depth 2

Beyond the paper, a depth warm-up (:func:`parse_depth_warmup`): the first updates train only
a shallower network of the same weights, which costs a fraction of a full-depth update,
then training goes on at the full depth (with the mixed-depth terms, if any)::

    --depth-warmup 1:400         the first 400 updates at depth 1
"""

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

from torch import Tensor

from .depth import DepthControl
from .schedule import check_depth


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
        for depth in depths:
            check_depth(depth, name=f"{option}: depth (in {value!r})")
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


@dataclass(frozen=True)
class DepthWarmup:
    """Train only at ``depths`` (per side) for the first ``updates`` updates."""

    depths: Tuple[int, ...]
    updates: int

    def active(self, num_updates: int) -> bool:
        return num_updates < self.updates


def parse_depth_warmup(value, sides: int = 1, option: str = "--depth-warmup") -> "DepthWarmup | None":
    """``"1:400"`` -> depth 1 for the first 400 updates (``ENC/DEC:UPDATES`` with ``sides=2``);
    ``""``/None -> no warm-up. Errors are ValueErrors naming ``option``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or "," in value or ":" not in value:
        raise ValueError(f"{option} is DEPTH:UPDATES, e.g. '1:400', got {value!r}")
    depth_text, _, updates_text = value.strip().partition(":")
    if not depth_text.strip():
        raise ValueError(f"{option} is DEPTH:UPDATES, e.g. '1:400': no DEPTH in {value!r}")
    (term,) = parse_mixed_depth(depth_text, sides=sides, option=option)
    try:
        updates = int(updates_text)
    except ValueError:
        raise ValueError(f"{option}: the updates must be an integer, got {updates_text!r} in {value!r}") from None
    if updates < 1:
        raise ValueError(f"{option}: the updates must be at least 1, got {updates} in {value!r}")
    return DepthWarmup(term.depths, updates)


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
            check_depth(depth, built, f"{option}: depth", built=f"{side} was built with")
        if term.depths == full:
            raise ValueError(
                f"{option}: depth {term.label.replace('_', '/')} is the full depth, whose loss is always"
                " included; list only shallower depths"
            )


def check_depth_options(
    mixed_depth, depth_warmup, recursions: Sequence[int], sides: Sequence[str] = ("the encoder", "the decoder"),
) -> Tuple[Tuple[DepthTerm, ...], "DepthWarmup | None"]:
    """Parse ``--mixed-depth`` and ``--depth-warmup`` and check that they fit ``recursions``
    (per side); returns (terms, warm-up). Errors are ValueErrors naming the option."""
    terms = parse_mixed_depth(mixed_depth, sides=len(sides))
    warmup = parse_depth_warmup(depth_warmup, sides=len(sides))
    check_mixed_depth(terms, recursions, sides=sides)
    if warmup is not None:
        check_mixed_depth([DepthTerm(warmup.depths)], recursions, sides=sides, option="--depth-warmup")
    return terms, warmup


def untrained_depth_warning(
    depths: Sequence[int], trained: Sequence[int], mixed_depth: Optional[str] = None,
) -> Optional[str]:
    """The warning for running a translation model at ``depths`` (encoder, decoder) when it was
    trained at its full depth ``trained`` with the ``--mixed-depth`` terms ``mixed_depth`` (the
    option's text): None when its training included these depths. A model run at a depth it was
    not trained at is much worse there, and it can be slower (longer outputs)."""
    depths, trained = tuple(depths), tuple(trained)
    if depths == trained:
        return None
    try:
        terms = parse_mixed_depth(mixed_depth or "", sides=2)
    except ValueError:
        terms = ()
    if any(term.depths == depths for term in terms):
        return None
    return (
        f"running at depth encoder {depths[0]}, decoder {depths[1]}, but this model was trained only at its full"
        f" depth {trained[0]}/{trained[1]}: expect much worse and possibly slower translations (train with"
        f" --criterion sret_mixed_depth_label_smoothed_cross_entropy --mixed-depth {depths[0]}"
        f"{'' if depths[0] == depths[1] else '/' + str(depths[1])}:0.5 for a model that runs at this depth)"
    )


def full_depth_label(model: DepthControl) -> str:
    """The metric label of the full depth (``"2"``, or ``"3_2"`` for encoder 3, decoder 2)."""
    full = model.recursions
    return DepthTerm(full if isinstance(full, tuple) else (full,)).label


def mixed_depth_loss(
    model: DepthControl, terms: Sequence[DepthTerm], full_loss: Tensor, shallow_loss: Callable[[], Tensor],
) -> Tuple[Tensor, Dict[str, Tensor]]:
    """``L = full_loss + sum_k w_k L(depth d_k)``: ``shallow_loss()`` is called with ``model``
    at each term's depths (:meth:`DepthControl.at_depth`) and computes that depth's loss.

    Returns the total and every depth's loss by label (the full depth's included), for logs.
    """
    losses: Dict[str, Tensor] = {full_depth_label(model): full_loss}
    total = full_loss
    for term in terms:
        with model.at_depth(*term.depths):
            loss = shallow_loss()
        losses[term.label] = loss
        total = total + term.weight * loss
    return total, losses
