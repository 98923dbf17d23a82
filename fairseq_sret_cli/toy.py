"""The toy task, for demos, tests and benchmarks.

The reversal corpus: reverse the words of a random sentence and map ``w<i>`` to ``v<i>``. A
tiny model learns it in a few hundred updates, so BLEU visibly rises over training. One
generator of sentence pairs feeds both forms: text files for fairseq's tools (demos, tests)
and token tensors for models trained without data files (benchmarks).

:class:`ToyTask` stands in for a fairseq task (``build_model`` only reads its dictionaries);
:func:`build_model` builds any registered architecture, ours or fairseq's, from
argparse-style overrides, the way ``fairseq-train --arch NAME --option value`` would.
torch and fairseq are imported only by the functions that need them.

Usage: ``sret-toy-data OUT_DIR`` (or ``python -m fairseq_sret_cli.toy_data OUT_DIR``) writes
``{train,valid,test}.{src,tgt}``.
"""

import argparse
import itertools
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Iterator, List, Sequence, Tuple

from . import user_errors

SPLITS = (("train", 3000), ("valid", 80), ("test", 60))

Pair = Tuple[List[int], List[int]]


def reversal_pairs(seed: int = 0, vocab_size: int = 24, lengths: Tuple[int, int] = (2, 8)) -> Iterator[Pair]:
    """Endless (source, target) pairs of word indices below ``vocab_size``: a random sentence
    of ``lengths[0]`` to ``lengths[1]`` words (both included) and the same words reversed."""
    rng = random.Random(seed)
    while True:
        source = [rng.randrange(vocab_size) for _ in range(rng.randint(*lengths))]
        yield source, source[::-1]


def write_reversal_corpus(folder, splits: Sequence[Tuple[str, int]] = SPLITS, seed: int = 0,
                          vocab_size: int = 24, lengths: Tuple[int, int] = (2, 8)) -> Path:
    """Write ``{split}.src`` (words ``w<i>``) and ``{split}.tgt`` (``v<i>``) for every
    (split, sentences) of ``splits``, the splits drawn one after the other from one seed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pairs = reversal_pairs(seed, vocab_size, lengths)
    for split, size in splits:
        chosen = list(itertools.islice(pairs, size))
        (folder / f"{split}.src").write_text("".join(_text(source, "w") for source, _ in chosen))
        (folder / f"{split}.tgt").write_text("".join(_text(target, "v") for _, target in chosen))
    return folder


def _text(indices: List[int], letter: str) -> str:
    return " ".join(f"{letter}{i}" for i in indices) + "\n"


def reversal_batch(pairs: Sequence[Pair], first_word: int, pad: int, eos: int):
    """Token tensors of ``pairs`` in fairseq's layout, right-padded: ``(source, source_lengths,
    prev_output_tokens, target)``, where source = words + eos, target = reversed words + eos
    and prev_output_tokens = eos + reversed words.

    Both sides share one vocabulary: word index ``i`` is token ``first_word + i``, standing
    for ``w<i>`` in the source and ``v<i>`` in the target.
    """
    import torch

    width = max(len(source) for source, _ in pairs) + 1
    source = torch.full((len(pairs), width), pad, dtype=torch.long)
    target = torch.full_like(source, pad)
    prev = torch.full_like(source, pad)
    for row, (words, reversed_words) in enumerate(pairs):
        n = len(words) + 1
        source[row, :n] = torch.tensor([first_word + i for i in words] + [eos])
        target[row, :n] = torch.tensor([first_word + i for i in reversed_words] + [eos])
        prev[row, :n] = torch.tensor([eos] + [first_word + i for i in reversed_words])
    lengths = torch.tensor([len(words) + 1 for words, _ in pairs])
    return source, lengths, prev, target


# ---------------------------------------------------------------- models without data files
class ToyTask:
    """One dictionary for source and target: fairseq's special symbols, then the words
    ``w0 .. w<vocab_size - 1>``."""

    def __init__(self, vocab_size: int = 30):
        from fairseq.data import Dictionary

        dictionary = Dictionary()
        for i in range(vocab_size):
            dictionary.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = dictionary

    @classmethod
    def of_dictionary_size(cls, size: int) -> "ToyTask":
        """A task whose dictionary holds ``size`` entries, special symbols included."""
        from fairseq.data import Dictionary

        return cls(size - len(Dictionary()))


def architecture_args(arch: str, **overrides) -> argparse.Namespace:
    """The options of architecture ``arch``: ``overrides`` (argparse names, e.g.
    ``encoder_layers=2``) and the architecture's defaults for everything else."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    import fairseq_sret.models  # noqa: F401  (registers the sret_transformer architectures)

    args = argparse.Namespace(**overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def build_model(arch: str, vocab_size: int = 30, task=None, **overrides):
    """The registered architecture ``arch`` with ``overrides``, built for ``task`` (default:
    a :class:`ToyTask` of ``vocab_size`` words)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    task = ToyTask(vocab_size) if task is None else task
    args = architecture_args(arch, **overrides)  # first: it registers our architectures
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task)


@user_errors("sret-toy-data")
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="sret-toy-data", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write the reversal toy corpus (reverse the words, map w<i> to v<i>) as"
                    " {train,valid,test}.{src,tgt} for fairseq-preprocess.\n\n  sret-toy-data data/toy",
    )
    parser.add_argument("out_dir", help="folder to write the split files to (other files in it are left alone)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--force", action="store_true",
                        help="replace split files this command did not make (or made with another seed)")
    args = parser.parse_args(argv)
    from .outputs import Outputs, exclusive

    folder = Path(args.out_dir)
    outputs = Outputs("sret-toy-data", force=args.force, settings={"seed": args.seed})
    names = [f"{split}.{side}" for split, _ in SPLITS for side in ("src", "tgt")]
    outputs.check([folder / name for name in names], folders=[folder])
    with exclusive(folder, "sret-toy-data", remove=True, why="two corpora into one folder would mix their splits"):
        # written aside, then each split file renamed into place
        staging = folder / f".sret-toy-data.{os.getpid()}"
        try:
            write_reversal_corpus(staging, seed=args.seed)
            for name in names:
                outputs.move_in(staging / name, folder / name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    print(f"wrote {', '.join(f'{s}.src/.tgt ({n} lines)' for s, n in SPLITS)} to {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
