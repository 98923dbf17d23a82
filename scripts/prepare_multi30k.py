#!/usr/bin/env python3
"""Prepare Multi30k (task 1) De-En: raw text -> joint SentencePiece BPE (8K) -> fairseq data-bin.

  python scripts/prepare_multi30k.py                              # download from multi30k/dataset
  python scripts/prepare_multi30k.py --src ../shared/data/multi30k/raw --out data-bin/multi30k_de_en
"""

import sys

from _prepare_cli import parser, run


def main(argv=None) -> int:
    p = parser(__doc__, "folder with {train,val,test_2016_flickr,test_2017_flickr}.{de,en} (or .gz).",
               "data-bin/multi30k_de_en", 8000, "de", "en")
    args = p.parse_args(argv)
    from fairseq_sret.data import multi30k

    return run(multi30k.prepare, args)


if __name__ == "__main__":
    sys.exit(main())
