#!/usr/bin/env python3
"""Prepare IWSLT'14 De-En as fairseq's prepare-iwslt14.sh does (Moses tokenization and
lowercasing, ratio-1.5 / 1-175 cleaning, valid = every 23rd training pair, test =
dev2010 + TEDX.dev2012 + tst2010 + tst2011 + tst2012), then a joint SentencePiece BPE
vocabulary (10K) and a fairseq data-bin.

  python scripts/prepare_iwslt14.py                        # download de-en.tgz
  python scripts/prepare_iwslt14.py --src ~/data/de-en.tgz  # or the folder it extracts to
"""

import sys

from _prepare_cli import parser, run


def main(argv=None) -> int:
    p = parser(__doc__, "de-en.tgz as distributed by the IWSLT/WIT3 site, or its extracted folder "
               "(train.tags.de-en.{de,en} and the IWSLT14.TED*.xml dev/test files).",
               "data-bin/iwslt14_de_en", 10000, "de", "en")
    args = p.parse_args(argv)
    from fairseq_sret.data import iwslt14

    return run(iwslt14.prepare, args)


if __name__ == "__main__":
    sys.exit(main())
