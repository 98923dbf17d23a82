"""Shared command line of the prepare_*.py scripts (not a script itself)."""

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # usable from a checkout without installing the package
    sys.path.insert(0, str(REPO))


def parser(description: str, src_help: str, default_out: str, vocab_size: int, src_lang: str, tgt_lang: str):
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", metavar="PATH", default=None, help=src_help + " Default: download from the official source.")
    p.add_argument("--out", metavar="DIR", default=str(REPO / default_out),
                   help="output data-bin (default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=vocab_size, help="joint SentencePiece vocabulary (default: %(default)s)")
    p.add_argument("--source-lang", default=src_lang, help="default: %(default)s")
    p.add_argument("--target-lang", default=tgt_lang, help="default: %(default)s")
    p.add_argument("--workers", type=int, default=1, help="processes for tokenization and binarisation (default: 1)")
    p.add_argument("--work-dir", metavar="DIR", default=None,
                   help="where downloads and extracted archives go (default: OUT/orig)")
    p.add_argument("--force", action="store_true", help="rebuild even if OUT already holds a prepared data-bin")
    return p


def run(prepare, args, **kwargs) -> int:
    from fairseq_sret.data.common import METADATA
    from fairseq_sret.data.download import DownloadError

    out = Path(args.out)
    if (out / METADATA).is_file() and not args.force:
        import json

        meta = json.loads((out / METADATA).read_text(encoding="utf-8"))
        same = (meta.get("options", {}).get("vocab_size") == args.vocab_size
                and (meta.get("source_lang"), meta.get("target_lang")) == (args.source_lang, args.target_lang))
        if same:
            print(f"[prepare] {out} is already prepared (use --force to rebuild)", file=sys.stderr)
            print(out)
            return 0
        print(f"[prepare] {out} was prepared with other settings: rebuilding", file=sys.stderr)
    start = time.time()
    try:
        prepare(out, src=args.src, src_lang=args.source_lang, tgt_lang=args.target_lang,
                vocab_size=args.vocab_size, workers=args.workers, work_dir=args.work_dir, **kwargs)
    except (DownloadError, FileNotFoundError, ValueError) as exc:
        print(f"[prepare] error: {exc}", file=sys.stderr)
        return 1
    print(f"[prepare] finished in {time.time() - start:.0f}s", file=sys.stderr)
    print(out)
    return 0
