"""Helpers for building small fairseq models in tests without data files."""

import torch

from fairseq_sret_cli.toy import ToyTask as DummyTask
from fairseq_sret_cli.toy import build_model


def build(arch, task=None, **overrides):
    """Build a fairseq model by architecture name with argparse-style overrides; returns
    (model, task)."""
    task = DummyTask() if task is None else task
    return build_model(arch, task=task, **overrides), task


SMALL = dict(
    encoder_embed_dim=32, decoder_embed_dim=32, encoder_ffn_embed_dim=48, decoder_ffn_embed_dim=48,
    encoder_attention_heads=4, decoder_attention_heads=4, encoder_layers=2, decoder_layers=2,
    dropout=0.0,
)


def sliced_model(groups: str, seed: int):
    """``sret_transformer`` at the SMALL sizes with ``groups`` attention groups on both sides
    and a strided, then random, decoder partition, built after ``torch.manual_seed(seed)``, in
    eval mode; returns (model, task)."""
    torch.manual_seed(seed)
    model, task = build("sret_transformer", **SMALL, encoder_groups=groups, decoder_groups=groups,
                        decoder_partition="strided,random")
    return model.eval(), task
