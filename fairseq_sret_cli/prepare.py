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
import hashlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

from . import HelpFormatter, UsageError, UserError, at_least, user_errors
from .outputs import Outputs, exclusive

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
        s.add_argument("--out", metavar="DIR", default=out,
                       help="output data-bin (default: %(default)s); other files in it are left alone")
        s.add_argument("--vocab-size", type=at_least(2), default=vocab,
                       help="joint SentencePiece vocabulary (default: %(default)s; a small corpus gives fewer"
                            " pieces, and sret_data.json records the real size)")
        s.add_argument("--source-lang", default=src_lang, help="default: %(default)s")
        s.add_argument("--target-lang", default=tgt_lang, help="default: %(default)s")
        s.add_argument("--workers", type=at_least(1), default=1,
                       help="processes for tokenization and binarisation (default: 1)")
        s.add_argument("--work-dir", metavar="DIR", default=None,
                       help="where downloads and extracted archives go (default: OUT/orig)")
        s.add_argument("--force", action="store_true",
                       help="rebuild even if OUT already holds a data-bin (made with other settings, or not by"
                            " this command); files of the data-bin's names are replaced, never --src")
        if name == "wmt14":
            s.add_argument("--input-sentence-size", type=at_least(0), default=4_000_000,
                           help="sentences sampled to train SentencePiece (default: %(default)s; 0 = all)")
    return p


def settings_of(args, corpus: Optional[str] = None) -> dict:
    """The options that decide a data-bin's content (recorded with its files): ``src`` is the
    corpus read (its full path; None: the official download), ``corpus`` what it held
    (:func:`corpus_fingerprint`)."""
    settings = {"dataset": args.dataset, "vocab_size": args.vocab_size, "source_lang": args.source_lang,
                "target_lang": args.target_lang, "src": str(Path(args.src).resolve()) if args.src else None}
    if corpus is not None:
        settings["corpus"] = corpus
    if args.dataset == "wmt14":
        settings["input_sentence_size"] = args.input_sentence_size
    return settings


def corpus_fingerprint(src: Path, out: Path, expected, work_dir: Path) -> str:
    """What the corpus ``src`` (a file or a folder) holds, in short: every file's path and the
    sha256 of all its bytes (:func:`fairseq_sret_cli.fingerprints.file_digest`). Hidden files
    and what this command writes (the data-bin's files in ``out``, downloads and extractions in
    ``work_dir``) are left out, so ``--out`` may be ``--src`` itself. A data-bin recorded with
    the fingerprint of before (of each file's first and last MiB) is not taken as prepared from
    this corpus: it is rebuilt with ``--force``."""
    from .fingerprints import file_digest, full

    files = [src] if src.is_file() else [Path(root, name) for root, dirs, names in os.walk(src)
                                         for name in names if not _hidden(Path(root, name), src)]
    digest = hashlib.sha256()
    for path in sorted(files):
        if not path.is_file() or _written_here(path, out, expected, work_dir):  # a dangling link, a pipe: not read
            continue
        name = path.relative_to(src) if path != src else path.name
        digest.update(f"{name}\0{file_digest(path)}\0".encode("utf-8", "surrogateescape"))
    return full(digest)


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _written_here(path: Path, out: Path, expected, work_dir: Path) -> bool:
    """Is ``path`` a file sret-prepare writes: a data-bin's file in ``out``, or anything in
    ``work_dir`` (downloads, extracted archives)?"""
    path = path.resolve()
    if path.is_relative_to(work_dir.resolve()):
        return True
    return path.is_relative_to(out.resolve()) and expected(path.relative_to(out.resolve()).as_posix())


def _already_prepared(out: Path, args, settings: dict) -> bool:
    from .data.common import METADATA

    if not (out / METADATA).is_file() or args.force:
        return False
    try:
        meta = json.loads((out / METADATA).read_text(encoding="utf-8"))
        options = meta.get("options", {})
    except (ValueError, AttributeError):  # not ours: the output rule decides
        return False
    asked = options.get("requested_vocab_size", options.get("vocab_size"))
    return (meta.get("recipe") == args.dataset and asked == args.vocab_size
            and (meta.get("source_lang"), meta.get("target_lang")) == (args.source_lang, args.target_lang)
            and _same_source(out, settings))


def _same_source(out: Path, settings: dict) -> bool:
    """Was ``out`` prepared from the corpus ``settings`` name, as it is now? (A data-bin made
    before its manifest recorded the corpus, or its contents, counts as made from it.)"""
    from .data.common import METADATA
    from .outputs import maker

    recorded = (maker(out / METADATA) or {}).get("settings") or {}
    return all(recorded.get(key, settings.get(key)) == settings.get(key) for key in ("src", "corpus"))


def data_bin_names(src_lang: str, tgt_lang: str):
    """Whether a file name (relative to OUT) may be one a data-bin of this pair holds."""
    langs = f"({re.escape(src_lang)}|{re.escape(tgt_lang)})"
    pair = f"{re.escape(src_lang)}-{re.escape(tgt_lang)}"
    pattern = re.compile(
        rf"^(sret_data\.json|spm\.(model|vocab)|preprocess\.log|dict\.{langs}\.txt"
        rf"|(train|valid|test\d*)\.{pair}\.{langs}\.(bin|idx)"
        rf"|text/(train|valid|test\d*|spm_input)(\.(sp|raw))?\.{langs})$")
    return lambda name: bool(pattern.match(name))


def _files_under(folder: Path) -> list:
    """Files below ``folder`` (relative names)."""
    return sorted(Path(root, f).relative_to(folder).as_posix() for root, _, files in os.walk(folder) for f in files)


def _data_bin_candidates(out: Path, expected) -> list:
    """The files in ``out`` and ``out/text`` (where a data-bin's files go) that have a data-bin's names."""
    if not out.is_dir():
        return []
    names = [p.name for p in out.iterdir() if not p.is_dir() or p.is_symlink()]
    if (out / "text").is_dir():
        names += [f"text/{p.name}" for p in (out / "text").iterdir()]
    return sorted(name for name in names if expected(name))


def install(staging: Path, out: Path, outputs: Outputs, expected) -> list:
    """Move every file of the finished data-bin ``staging`` into ``out`` (each in one rename,
    ``sret_data.json`` last: a data-bin with it is complete); the files an earlier
    preparation made that this one does not are removed. Returns the relative names."""
    from .data.common import METADATA

    names = _files_under(staging)
    outputs.check([out / name for name in names])
    for name in sorted(names, key=lambda n: n == METADATA):
        outputs.move_in(staging / name, out / name)
    for name in _data_bin_candidates(out, expected):
        if name not in names:
            outputs.remove(out / name)
    return names


@user_errors("sret-prepare", interrupted="interrupted; OUT was not changed (downloads stay in the work folder):"
                                         " rerun the same command to continue")
def main(argv=None) -> int:
    args = get_parser().parse_args(argv)
    from .data import iwslt14, multi30k, wmt14
    from .data.download import DownloadError, is_archive

    prepare = {"multi30k": multi30k.prepare, "iwslt14": iwslt14.prepare, "wmt14": wmt14.prepare}[args.dataset]
    extra = {"input_sentence_size": args.input_sentence_size} if args.dataset == "wmt14" else {}
    out = Path(args.out)
    src = Path(args.src) if args.src else None
    if src is not None and not src.exists():
        raise UsageError(f"--src {src} does not exist")
    expected = data_bin_names(args.source_lang, args.target_lang)
    work_dir = Path(args.work_dir) if args.work_dir else out / "orig"  # downloads stay for a retry
    settings = settings_of(args, corpus_fingerprint(src, out, expected, work_dir) if src is not None else None)
    if _already_prepared(out, args, settings):
        print(f"[prepare] {out} is already prepared (use --force to rebuild)", file=sys.stderr)
        print(out)
        return 0
    outputs = Outputs("sret-prepare", force=args.force, settings=settings, inputs=[src])
    # everything in the way, before the long work: what a data-bin of these names would replace
    outputs.check([out / name for name in _data_bin_candidates(out, expected)], folders=[out])
    uses_work_dir = src is None or src.is_file() or any(p.is_file() and is_archive(p) for p in src.iterdir())
    downloads = Outputs("sret-prepare", force=args.force)
    if uses_work_dir and args.work_dir is None and work_dir.exists() and not downloads.made_by_me(work_dir):
        downloads.check([], replaced=[work_dir],
                        fix="give another --work-dir, or pass --force to use that folder for downloads")
    start = time.time()
    # one preparation per OUT; a failure leaves no trace of an OUT it made
    with exclusive(out, "sret-prepare", remove=True, why="two preparations into one folder would mix their data-bins"):
        # built in a hidden folder inside OUT, then moved in file by file: a failure leaves OUT as it was
        staging = out / f".sret-prepare.{os.getpid()}"
        try:
            prepare(staging, src=args.src, src_lang=args.source_lang, tgt_lang=args.target_lang,
                    vocab_size=args.vocab_size, workers=args.workers, work_dir=work_dir, **extra)
            if uses_work_dir and args.work_dir is None and not downloads.made_by_me(work_dir):
                downloads.record(work_dir)
            install(staging, out, outputs, expected)
        except DownloadError as exc:
            raise UserError(str(exc)) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    print(f"[prepare] data-bin ready: {out} (in {time.time() - start:.0f}s)", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
