"""Binarise text into a fairseq data-bin with ``fairseq-preprocess`` (joined dictionary)."""

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

from .io import log


def fairseq_preprocess(
    src_lang: str,
    tgt_lang: str,
    prefixes: Dict[str, Path],
    dest_dir,
    workers: int = 1,
    extra_args: Optional[list] = None,
    in_process: bool = True,
) -> Path:
    """Run ``fairseq-preprocess --joined-dictionary`` (in this process, or a subprocess).

    ``prefixes`` maps ``train``/``valid``/``test`` (and ``test1``... for more test sets,
    given to fairseq as a comma-separated ``--testpref``) to file prefixes
    ``PREFIX.{src_lang,tgt_lang}``. fairseq's log goes to ``dest_dir/preprocess.log``.
    Dictionaries and binaries already in ``dest_dir`` are replaced.
    """
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    for old in list(dest_dir.glob("dict.*.txt")) + list(dest_dir.glob("*.bin")) + list(dest_dir.glob("*.idx")):
        old.unlink()
    (dest_dir / "preprocess.log").unlink(missing_ok=True)
    tests = [str(prefixes[k]) for k in sorted(prefixes) if k.startswith("test")]
    argv = [
        "--source-lang", src_lang, "--target-lang", tgt_lang,
        "--trainpref", str(prefixes["train"]),
        "--destdir", str(dest_dir), "--joined-dictionary", "--workers", str(workers),
    ]
    if "valid" in prefixes:
        argv += ["--validpref", str(prefixes["valid"])]
    if tests:
        argv += ["--testpref", ",".join(tests)]
    argv += list(extra_args or [])
    log("binarising with fairseq-preprocess --joined-dictionary")
    if in_process:
        _preprocess_here(argv)
    else:
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        result = subprocess.run([sys.executable, "-m", "fairseq_cli.preprocess", *argv], env=env,
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"fairseq-preprocess failed:\n{result.stderr[-3000:]}")
    return dest_dir


def _preprocess_here(argv) -> None:
    """``fairseq_cli.preprocess.main`` with its log kept in the data-bin's preprocess.log
    only (not on the console), and its file handler removed afterwards."""
    root = logging.getLogger()
    root_handlers = list(root.handlers)
    from fairseq import options
    from fairseq_cli import preprocess

    for handler in [h for h in root.handlers if h not in root_handlers]:
        root.removeHandler(handler)  # fairseq_cli.preprocess's import-time basicConfig (stdout)
    logger = logging.getLogger("fairseq_cli.preprocess")
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    finally:
        for handler in logger.handlers[len(handlers):]:
            logger.removeHandler(handler)
            handler.close()
        logger.propagate, logger.level = propagate, level
