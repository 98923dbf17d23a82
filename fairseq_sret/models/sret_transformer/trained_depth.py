"""Depth on demand across checkpoints: ``--{side}-recursions`` is recorded in checkpoints as the
applications the layers were built (and trained) with, ``--{side}-depth`` chooses how many run
(``--model-overrides "{'encoder_depth': 1}"``), with a warning when that depth was never trained.

Older uses keep working, each with one warning that names the option to use now:

- a checkpoint saved before ``--{side}-depth`` existed records the built count as
  ``{side}_trained_recursions`` and the depth that ran as ``{side}_recursions``
  (:func:`~fairseq_sret.depth_options.upgrade_depth_options` reads them in today's
  words, for the fairseq adapter and for ``sret-export-hf``);
- ``--model-overrides "{'encoder_recursions': 1}"`` on a checkpoint built with more recursions
  meant its depth: the layers are built with the checkpoint's count (recorded beside its
  weights, or as many as its NLLs) and run that depth (:func:`recursions_of_checkpoint`, read by
  the model when it loads).
"""

import logging
from typing import Optional

from ...depth_options import SIDES, upgrade_depth_options  # noqa: F401
from ...core.mixed_depth import untrained_depth_warning
from .dictionaries import DICTIONARY_FINGERPRINTS
from .spec import listed_values

logger = logging.getLogger(__name__)


def recursions_of_checkpoint(state_dict, side: str) -> Optional[int]:
    """The recursions ``side``'s layers were built with, as the checkpoint's weights say: as
    recorded in their metadata beside them (:meth:`~.model.SReTTransformerModel._save_to_state_dict`),
    else how many NLLs (``{side}.layers.<i>.recursive.nlls.<r>``) they hold (None: neither, so the
    weights do not depend on it)."""
    recorded = ((getattr(state_dict, "_metadata", None) or {}).get("") or {}).get(f"{side}_recursions")
    if isinstance(recorded, int) and not isinstance(recorded, bool):
        return recorded
    prefix, found = f"{side}.layers.", set()
    for key in state_dict:
        if key.startswith(prefix) and ".recursive.nlls." in key:
            found.add(int(key.split(".recursive.nlls.", 1)[1].split(".", 1)[0]))
    return max(found) + 1 if found else None


def upgrade_listed_depth_override(args) -> None:
    """A trained model's configuration (it records its dictionaries' fingerprints) whose
    ``{side}_recursions`` is fewer than the per-recursion values its ``{side}_groups`` or
    ``{side}_partition`` list: ``--model-overrides "{'encoder_recursions': 1}"``, the older way to
    say its depth. Read in today's words, built with as many recursions as the lists name and
    running the given depth, with one warning. On a command line that trains, the same options
    stay an error (:func:`~.spec.recursion_schedule`)."""
    if not any(getattr(args, key, None) for key in DICTIONARY_FINGERPRINTS):
        return
    for side in SIDES:
        recursions, depth = getattr(args, f"{side}_recursions"), getattr(args, f"{side}_depth", None)
        listed = max(listed_values(getattr(args, f"{side}_groups", None)),
                     listed_values(getattr(args, f"{side}_partition", None)))
        if depth is not None or not isinstance(recursions, int) or not 1 <= recursions < listed:
            continue
        logger.warning(f"--{side}-recursions {recursions} is fewer than the {listed} recursions this model's groups"
                       f" list: running depth {recursions} of {listed}; say it with --{side}-depth (--model-overrides"
                       f" \"{{'{side}_depth': {recursions}}}\")")
        setattr(args, f"{side}_recursions", listed)
        setattr(args, f"{side}_depth", recursions)


def warn_untrained_depth(args) -> None:
    """Warn when the model runs at a depth its training did not include: the full depth, or a
    ``--mixed-depth`` term of its criterion
    (:func:`fairseq_sret.core.mixed_depth.untrained_depth_warning`). Said nothing of a
    configuration that does not record its criterion (fairseq-hydra-train keeps it apart from
    the model's)."""
    if getattr(args, "criterion", None) is None:
        return
    recursions = [getattr(args, f"{side}_recursions") for side in SIDES]
    depths = [getattr(args, f"{side}_depth", None) or built for side, built in zip(SIDES, recursions)]
    message = untrained_depth_warning(depths, recursions, getattr(args, "mixed_depth", None))
    if message is not None:
        logger.warning(message)


def check_checkpoint_recursions(state_dict, name: str, recursions: int, side: str) -> None:
    """A checkpoint's NLLs ``{name}.recursive.nlls.<r>`` must number the ``recursions`` the
    layer was built with (more of them: the model builds them first, see
    :meth:`~.model.SReTTransformerModel.load_state_dict`); fewer fail, naming the count."""
    prefix = f"{name}.recursive.nlls." if name else "recursive.nlls."
    found = {key[len(prefix):].split(".", 1)[0] for key in state_dict if key.startswith(prefix)}
    if not found:
        return
    saved = max(int(i) for i in found) + 1
    if saved < recursions:
        raise ValueError(
            f"--{side}-recursions={recursions} is larger than the {saved} recursions this model was trained with"
            f" ({name}: the checkpoint holds NLLs for {saved}); a trained model runs at depth 1 to {saved}, e.g."
            f" --model-overrides \"{{'{side}_depth': {saved}}}\""
        )
    if saved > recursions:
        raise ValueError(f"{name}: the checkpoint holds NLLs for {saved} {side} recursions, the layer was built with"
                         f" {recursions}: give --{side}-recursions {saved} (and --{side}-depth for a smaller depth)")
