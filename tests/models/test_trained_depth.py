"""A depth override below the trained depth warns at load time unless the model was trained
for that depth (a ``--mixed-depth`` term); the depth stays usable either way."""

import argparse
import logging

import pytest

pytest.importorskip("fairseq")


from fairseq_sret.models.sret_transformer.trained_depth import upgrade_depth_options, warn_untrained_depth


def checkpoint_args(encoder=1, decoder=1, mixed_depth=None, criterion="label_smoothed_cross_entropy"):
    """A model built with 2 recursions per side running at depth encoder/decoder."""
    args = argparse.Namespace(encoder_recursions=2, decoder_recursions=2, encoder_depth=encoder, decoder_depth=decoder,
                              criterion=criterion)
    if mixed_depth is not None:
        args.mixed_depth = mixed_depth
    return args


def older_checkpoint_args(encoder=1, decoder=1, **kwargs):
    """The same, as a checkpoint saved before --encoder-depth said it (recursions: the depth that ran)."""
    args = checkpoint_args(**kwargs)
    for side, depth in (("encoder", encoder), ("decoder", decoder)):
        setattr(args, f"{side}_recursions", depth)
        setattr(args, f"{side}_trained_recursions", 2)
        delattr(args, f"{side}_depth")
    return args


@pytest.mark.parametrize("args,warns", [
    (checkpoint_args(), True),  # trained at full depth only
    (checkpoint_args(criterion="sret_mixed_depth_label_smoothed_cross_entropy", mixed_depth="1:0.5"), False),
    (checkpoint_args(criterion="sret_mixed_depth_label_smoothed_cross_entropy", mixed_depth="1/2:0.5"), True),
    (checkpoint_args(encoder=1, decoder=2, mixed_depth="1/2:0.5"), False),
    (checkpoint_args(encoder=2, decoder=2), False),  # the trained depth
    (checkpoint_args(criterion=None), False),  # a hydra config: the criterion is not recorded with the model
    (older_checkpoint_args(), True),
    (older_checkpoint_args(encoder=2, decoder=2), False),
    (older_checkpoint_args(encoder=1, decoder=2, mixed_depth="1/2:0.5"), False),
])
def test_untrained_depth_warns_at_load(args, warns, caplog):
    with caplog.at_level(logging.WARNING):
        upgrade_depth_options(args)
        warn_untrained_depth(args)
    warned = [r.getMessage() for r in caplog.records if "trained only at its full depth" in r.getMessage()]
    assert bool(warned) == warns
    if warns:
        depths = f"{args.encoder_depth}" + ("" if args.encoder_depth == args.decoder_depth
                                             else f"/{args.decoder_depth}")
        assert f"--mixed-depth {depths}:0.5" in warned[0]
