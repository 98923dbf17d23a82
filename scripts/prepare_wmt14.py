#!/usr/bin/env python3
"""Prepare WMT'14 En-De: Europarl v7 + Common Crawl + News Commentary v9 (training),
newstest2013 (valid), newstest2014 full (test); punctuation normalization, a joint
SentencePiece BPE vocabulary (32K), ratio-1.5 / 1-250 cleaning, fairseq data-bin.

  python scripts/prepare_wmt14.py --workers 8          # download from statmt.org (~1.5 GB)
  python scripts/prepare_wmt14.py --src ~/data/wmt14   # folder with the archives or their files:
      europarl-v7.de-en.{en,de}, commoncrawl.de-en.{en,de}, news-commentary-v9.de-en.{en,de},
      newstest2013.{en,de} (or newstest2013-{src,ref}.*.sgm), newstest2014-deen-{src,ref}.*.sgm
"""

import sys

from _prepare_cli import parser, run


def main(argv=None) -> int:
    p = parser(__doc__, "folder with the WMT'14 corpora, dev and test files (or their .tgz archives).",
               "data-bin/wmt14_en_de", 32000, "en", "de")
    p.add_argument("--input-sentence-size", type=int, default=4_000_000,
                   help="sentences sampled to train SentencePiece (default: %(default)s; 0 = all)")
    args = p.parse_args(argv)
    from fairseq_sret.data import wmt14

    return run(wmt14.prepare, args, input_sentence_size=args.input_sentence_size)


if __name__ == "__main__":
    sys.exit(main())
