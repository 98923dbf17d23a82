"""Build registered fairseq models without data files (tests, benchmarks, parameter counts).

:class:`ToyTask` stands in for a fairseq task: ``build_model`` only reads its dictionaries.
:func:`build_model` builds any registered architecture, ours or fairseq's, from
argparse-style overrides, the way ``fairseq-train --arch NAME --option value`` would.
"""

import argparse

from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

from ..models import sret_transformer  # noqa: F401  (registers the sret_transformer architectures)


class ToyTask:
    """One dictionary for source and target: fairseq's special symbols, then the words
    ``w0 .. w<vocab_size - 1>``."""

    def __init__(self, vocab_size: int = 30):
        dictionary = Dictionary()
        for i in range(vocab_size):
            dictionary.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = dictionary

    @classmethod
    def of_dictionary_size(cls, size: int) -> "ToyTask":
        """A task whose dictionary holds ``size`` entries, special symbols included."""
        return cls(size - len(Dictionary()))


def architecture_args(arch: str, **overrides) -> argparse.Namespace:
    """The options of architecture ``arch``: ``overrides`` (argparse names, e.g.
    ``encoder_layers=2``) and the architecture's defaults for everything else."""
    args = argparse.Namespace(**overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def build_model(arch: str, vocab_size: int = 30, task=None, **overrides):
    """The registered architecture ``arch`` with ``overrides``, built for ``task`` (default:
    a :class:`ToyTask` of ``vocab_size`` words)."""
    task = ToyTask(vocab_size) if task is None else task
    return ARCH_MODEL_REGISTRY[arch].build_model(architecture_args(arch, **overrides), task)
