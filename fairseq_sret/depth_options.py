"""A fairseq checkpoint's depth options in today's words (no fairseq needed: the fairseq adapter
and ``sret-export-hf`` read checkpoints through it).

``{side}_recursions`` is how many applications a layer is built (and trained) with, ``{side}_depth``
how many run (None: all). Checkpoints saved before ``--{side}-depth`` existed said it another way:
``{side}_trained_recursions`` the applications built, ``{side}_recursions`` the depth that ran.
"""

import logging

logger = logging.getLogger(__name__)

SIDES = ("encoder", "decoder")

def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def upgrade_depth_options(args, depth_overridable: bool = True) -> None:
    """Read a checkpoint's older depth options in today's words, with one warning that names the
    options to use now: its ``{side}_trained_recursions`` is ``{side}_recursions`` (the
    applications built), and a smaller ``{side}_recursions`` beside it (the old depth override)
    is ``{side}_depth``. A larger one fails, as a depth beyond the trained count does.

    ``depth_overridable=False``: the checkpoint's config is fairseq-hydra-train's, where fairseq
    applies ``--model-overrides`` only to the keys the saved config holds; one saved before
    ``{side}_depth`` existed never receives ``{'encoder_depth': N}``, so the warning gives the
    older words, which do reach it."""
    read = []
    for side in SIDES:
        trained = getattr(args, f"{side}_trained_recursions", None)
        if trained is None:
            continue
        given = getattr(args, f"{side}_recursions")
        setattr(args, f"{side}_trained_recursions", None)
        if not _is_count(given):  # an invalid count is the spec's to name
            continue
        if given > trained:
            raise ValueError(
                f"--{side}-recursions={given} is larger than the {trained} recursions this model was trained with"
                f" ({side}_trained_recursions={trained}); a trained model runs at depth 1 to {trained}, e.g."
                f" --model-overrides \"{{'{side}_depth': {trained}}}\""
            )
        setattr(args, f"{side}_recursions", trained)
        if given < trained and getattr(args, f"{side}_depth", None) is None:
            setattr(args, f"{side}_depth", given)
        depth = getattr(args, f"{side}_depth", None)
        read.append(f"{side}_recursions={trained}" + ("" if depth is None else f", {side}_depth={depth}"))
    if read:
        said = ("this checkpoint says depth in its older words ({side}_trained_recursions: the applications built,"
                " {side}_recursions: the depth that runs); read as " + "; ".join(read) + ".")
        if depth_overridable:
            logger.warning(said + " Today --{side}-recursions is the applications built and --{side}-depth the"
                           " depth that runs (--model-overrides \"{'encoder_depth': 1, 'decoder_depth': 1}\")")
        else:
            logger.warning(said + " Its fairseq-hydra-train config has no {side}_depth, and fairseq overrides only"
                           " the keys such a config holds, so --model-overrides \"{'encoder_depth': 1}\" does not"
                           " reach it: choose its depth in the older words, --model-overrides"
                           " \"{'encoder_recursions': 1, 'decoder_recursions': 1}\"")
