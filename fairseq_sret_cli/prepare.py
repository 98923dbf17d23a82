"""Prepare a translation data set as a fairseq data-bin: the official data (downloaded, or a
local copy with --src), the benchmark's cleaning and tokenization, a joint SentencePiece
vocabulary, then binarised splits plus ``sret_data.json`` (read by ``sret-evaluate``).

  sret-prepare multi30k --src ../shared/data/multi30k/raw --out data-bin/multi30k_de_en

multi30k  Multi30k task 1 De-En: raw text, joint SentencePiece BPE 8K; test = test_2016_flickr,
          test1 = test_2017_flickr.
iwslt14   IWSLT'14 De-En as fairseq's prepare-iwslt14.sh does it (Moses tokenization and
          lowercasing, ratio-1.5 / 1-175 cleaning, valid = every 23rd training pair, test =
          dev2010 + TEDX.dev2012 + tst2010-2012), then joint SentencePiece BPE 10K.
wmt14     WMT'14 En-De: Europarl v7 + Common Crawl + News Commentary v9, newstest2013 (valid),
          newstest2014 full (test); punctuation normalization, joint SentencePiece BPE 32K,
          ratio-1.5 / 1-250 cleaning.
"""

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from . import HelpFormatter, user_errors

#: name -> (default output, vocabulary, source language, target language, --src help)
DATASETS = {
    "multi30k": ("data-bin/multi30k_de_en", 8000, "de", "en",
                 "folder with {train,val,test_2016_flickr,test_2017_flickr}.{de,en} (or .gz)"),
    "iwslt14": ("data-bin/iwslt14_de_en", 10000, "de", "en",
                "de-en.tgz as distributed by the IWSLT/WIT3 site, or its extracted folder"
                " (train.tags.de-en.{de,en} and the IWSLT14.TED*.xml dev/test files)"),
    "wmt14": ("data-bin/wmt14_en_de", 32000, "en", "de",
              "folder with the WMT'14 corpora, dev and test files (or their .tgz archives):"
              " europarl-v7.de-en.{en,de}, commoncrawl.de-en.{en,de}, news-commentary-v9.de-en.{en,de},"
              " newstest2013.{en,de} (or its .sgm files), newstest2014-deen-{src,ref}.*.sgm"),
}


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sret-prepare", description=__doc__, formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="dataset", required=True, metavar="{multi30k,iwslt14,wmt14}")
    for name, (out, vocab, src_lang, tgt_lang, src_help) in DATASETS.items():
        s = sub.add_parser(name, help=f"prepare {name}", formatter_class=HelpFormatter,
                           description=f"Prepare {name} (see sret-prepare --help).\n\n"
                                       f"  sret-prepare {name} --src DIR --out {out}")
        s.add_argument("--src", metavar="PATH", default=None,
                       help=src_help + ". Default: download from the official source.")
        s.add_argument("--out", metavar="DIR", default=out, help="output data-bin (default: %(default)s)")
        s.add_argument("--vocab-size", type=int, default=vocab, help="joint SentencePiece vocabulary (default: %(default)s)")
        s.add_argument("--source-lang", default=src_lang, help="default: %(default)s")
        s.add_argument("--target-lang", default=tgt_lang, help="default: %(default)s")
        s.add_argument("--workers", type=int, default=1, help="processes for tokenization and binarisation (default: 1)")
        s.add_argument("--work-dir", metavar="DIR", default=None,
                       help="where downloads and extracted archives go (default: OUT/orig)")
        s.add_argument("--force", action="store_true", help="rebuild even if OUT already holds a prepared data-bin")
        if name == "wmt14":
            s.add_argument("--input-sentence-size", type=int, default=4_000_000,
                           help="sentences sampled to train SentencePiece (default: %(default)s; 0 = all)")
    return p


def _already_prepared(out: Path, args) -> bool:
    from .data.common import METADATA

    if not (out / METADATA).is_file() or args.force:
        return False
    meta = json.loads((out / METADATA).read_text(encoding="utf-8"))
    same = (meta.get("options", {}).get("vocab_size") == args.vocab_size
            and (meta.get("source_lang"), meta.get("target_lang")) == (args.source_lang, args.target_lang))
    if not same:
        print(f"[prepare] {out} was prepared with other settings: rebuilding", file=sys.stderr)
    return same


def replace_folder(new: Path, out: Path, keep: Path) -> None:
    """Put the finished data-bin ``new`` at ``out``; ``keep`` (the downloads), if inside the
    old ``out``, moves along."""
    if out.exists():
        if keep.is_dir() and keep.parent.resolve() == out.resolve():
            os.replace(keep, new / keep.name)
        old = out.parent / f".{out.name}.replaced"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        os.replace(new, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, out)


@user_errors("sret-prepare")
def main(argv=None) -> int:
    args = get_parser().parse_args(argv)
    from .data import iwslt14, multi30k, wmt14
    from .data.download import DownloadError

    prepare = {"multi30k": multi30k.prepare, "iwslt14": iwslt14.prepare, "wmt14": wmt14.prepare}[args.dataset]
    extra = {"input_sentence_size": args.input_sentence_size} if args.dataset == "wmt14" else {}
    out = Path(args.out)
    if _already_prepared(out, args):
        print(f"[prepare] {out} is already prepared (use --force to rebuild)", file=sys.stderr)
        print(out)
        return 0
    if out.exists() and not out.is_dir():
        print(f"sret-prepare: error: {out} is a file, not a folder", file=sys.stderr)
        return 1
    start = time.time()
    # built beside OUT and moved into place when complete: a failure leaves OUT as it was
    staging = out.parent / f".{out.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    work_dir = Path(args.work_dir) if args.work_dir else out / "orig"  # downloads stay for a retry
    try:
        prepare(staging, src=args.src, src_lang=args.source_lang, tgt_lang=args.target_lang,
                vocab_size=args.vocab_size, workers=args.workers, work_dir=work_dir, **extra)
    except (DownloadError, OSError, ValueError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        print(f"sret-prepare: error: {exc}", file=sys.stderr)
        return 1
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_folder(staging, out, keep=work_dir)
    print(f"[prepare] finished in {time.time() - start:.0f}s", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
