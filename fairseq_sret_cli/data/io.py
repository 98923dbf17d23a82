"""Small file helpers shared by the recipes: line I/O, progress messages, file lookup."""

import functools
import gzip
import os
import zlib
import time
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

from .. import log as lab_log


#: data preparation's progress lines: ``[prepare] ...``
log = functools.partial(lab_log, stage="prepare")


def open_text(path, mode: str = "r"):
    """Open a UTF-8 text file, transparently gunzipping ``*.gz``.

    Lines end at ``\\n`` only (like perl's ``<FH>``): a stray ``\\r`` or U+2028 inside a
    segment does not split it, which keeps parallel files aligned.
    """
    path = str(path)
    if path.endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8", newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")


def read_lines(path) -> List[str]:
    """All lines of a text file without their line ends: ``\n``, or ``\r\n`` as Windows
    editors write them (a ``\r`` elsewhere stays, see :func:`open_text`); a UTF-8 byte order
    mark at the start of the file is dropped. Neither becomes part of a word (of a
    dictionary, of a reference).

    Raises ``ValueError`` naming the file for text that is not UTF-8 and for a damaged or
    truncated ``.gz``.
    """
    lines: List[str] = []
    try:
        with open_text(path) as f:
            for line in f:
                if line.endswith("\r\n"):
                    line = line[:-2]
                elif line.endswith("\n"):
                    line = line[:-1]
                lines.append(line)
        if lines and lines[0].startswith("\ufeff"):
            lines[0] = lines[0][1:]
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (line {_first_undecodable_line(path)}: {exc.reason})") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ValueError(f"{path}: damaged or truncated gzip file ({exc})") from None
    return lines


def _first_undecodable_line(path) -> int:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


def write_lines(path, lines: Iterable[str]) -> int:
    """Write lines (newline-terminated); returns how many."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open_text(path, "w") as f:
        for line in lines:
            f.write(line + "\n")
            n += 1
    return n


def find_file(root, names: Sequence[str], required: bool = True) -> Optional[Path]:
    """The first file under ``root`` (searched recursively) whose name is in ``names``.

    Names are tried in order, so ``["train.de", "train.de.gz"]`` prefers the plain file.
    """
    root = Path(root)
    for name in names:
        direct = root / name
        if direct.is_file():
            return direct
        base = os.path.basename(name)
        matches = sorted(p for p in root.rglob(base) if p.is_file() and str(p).endswith(name))
        if matches:
            return matches[0]
    if required:
        raise FileNotFoundError(f"none of {list(names)} found under {root}")
    return None


class LineProgress:
    """Counts processed items and logs every ``every`` of them."""

    def __init__(self, what: str, every: int = 100_000, total: Optional[int] = None):
        self.what, self.every, self.total = what, every, total
        self.n, self.start = 0, time.time()

    def add(self, n: int) -> None:
        before = self.n // self.every
        self.n += n
        if self.n // self.every > before:
            total = f"/{self.total:,}" if self.total else ""
            log(f"{self.what}: {self.n:,}{total} lines ({time.time() - self.start:.0f}s)")
