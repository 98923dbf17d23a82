"""Helpers for building small fairseq models in tests without data files."""

import argparse

import fairseq_sret.models  # noqa: F401  (registers sret_transformer)
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY


class DummyTask:
    def __init__(self, vocab_size=30):
        d = Dictionary()
        for i in range(vocab_size):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


def build(arch, task=None, **overrides):
    """Build a fairseq model by architecture name with argparse-style overrides."""
    task = task or DummyTask()
    args = argparse.Namespace(**overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task), task


SMALL = dict(
    encoder_embed_dim=32, decoder_embed_dim=32, encoder_ffn_embed_dim=48, decoder_ffn_embed_dim=48,
    encoder_attention_heads=4, decoder_attention_heads=4, encoder_layers=2, decoder_layers=2,
    dropout=0.0,
)
