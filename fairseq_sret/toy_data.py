"""A generated toy translation corpus for tests and demos (no download, no fairseq).

The task: reverse the source words and map ``w<i>`` to ``v<i>``. A tiny model learns it
in a few hundred updates, so BLEU visibly rises over training.

Usage: ``python -m fairseq_sret.toy_data OUT_DIR`` writes ``{train,valid,test}.{src,tgt}``.
"""

import argparse
import random
from pathlib import Path

SPLITS = (("train", 3000), ("valid", 80), ("test", 60))


def write_reversal_corpus(folder, seed: int = 0, vocab: int = 24, max_len: int = 8) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    for split, size in SPLITS:
        src, tgt = [], []
        for _ in range(size):
            sentence = [rng.choice(words) for _ in range(rng.randint(2, max_len))]
            src.append(" ".join(sentence))
            tgt.append(" ".join(w.replace("w", "v") for w in reversed(sentence)))
        (folder / f"{split}.src").write_text("\n".join(src) + "\n")
        (folder / f"{split}.tgt").write_text("\n".join(tgt) + "\n")
    return folder


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = write_reversal_corpus(args.out_dir, args.seed)
    print(f"wrote {', '.join(f'{s}.src/.tgt ({n} lines)' for s, n in SPLITS)} to {folder}")


if __name__ == "__main__":
    main()
