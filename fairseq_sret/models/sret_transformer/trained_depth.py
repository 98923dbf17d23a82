"""Depth on demand across checkpoints: the recursions a model was trained with are recorded
at its first build (kept in checkpoints), so a checkpoint runs shallower by a depth override,
with a warning when that depth was never trained, and a checkpoint whose NLLs do not match
fails saying which override fixes it."""

import logging

from ...core import Recursive
from ...core.mixed_depth import untrained_depth_warning

logger = logging.getLogger(__name__)


def record_trained_recursions(args) -> None:
    """At the first build, record ``--encoder/decoder-recursions`` as the trained counts
    (``{side}_trained_recursions``; an existing record, e.g. a checkpoint's, is kept)."""
    for side in ("encoder", "decoder"):
        if getattr(args, f"{side}_trained_recursions", None) is None:
            setattr(args, f"{side}_trained_recursions", getattr(args, f"{side}_recursions"))


def warn_untrained_depth(args) -> None:
    """Warn when a depth override runs a model at a depth its training did not include: the
    full depth, or a ``--mixed-depth`` term of its criterion
    (:func:`fairseq_sret.core.mixed_depth.untrained_depth_warning`). Said nothing of a
    configuration that does not record its criterion (fairseq-hydra-train keeps it apart from
    the model's)."""
    if getattr(args, "criterion", None) is None:
        return
    message = untrained_depth_warning(
        [getattr(args, f"{side}_recursions") for side in ("encoder", "decoder")],
        [getattr(args, f"{side}_trained_recursions") for side in ("encoder", "decoder")],
        getattr(args, "mixed_depth", None),
    )
    if message is not None:
        logger.warning(message)


def check_checkpoint_recursions(state_dict, name: str, recursive: Recursive, side: str) -> None:
    """A checkpoint's NLLs ``{name}.recursive.nlls.<r>`` must number the recursions the
    layer was built with; a mismatch (a checkpoint saved before the trained count was
    recorded, loaded with a depth override) fails saying which override fixes it."""
    prefix = f"{name}.recursive.nlls." if name else "recursive.nlls."
    found = {key[len(prefix):].split(".", 1)[0] for key in state_dict if key.startswith(prefix)}
    if recursive.nlls is None or not found:
        return
    saved = max(int(i) for i in found) + 1
    built = recursive.recursions
    if saved == built:
        return
    if saved > built:
        raise ValueError(
            f"{name}: the checkpoint holds NLLs for {saved} {side} recursions, the model was built with"
            f" {built}. A checkpoint saved before {side}_trained_recursions was recorded, run at depth"
            f" {built}, needs the trained count too: --model-overrides \"{{'{side}_recursions': {built},"
            f" '{side}_trained_recursions': {saved}}}\" (hub: from_pretrained(..., {side}_recursions={built},"
            f" {side}_trained_recursions={saved})); training from it needs --{side}-recursions {saved}"
        )
    raise ValueError(
        f"{name}: the checkpoint holds NLLs for {saved} {side} recursions, but the model was built"
        f" with {built}: it was trained with {saved} (train with --{side}-recursions {saved}, or give"
        f" '{side}_trained_recursions': {saved} in --model-overrides)"
    )
