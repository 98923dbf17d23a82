"""Writes that a reader, or a process killed at any moment, sees whole or not at all.

Standard library only: the fairseq plugin (checkpoint copies), the checkpoint helpers and
the experiment runner (results, run records) share it.
"""

import contextlib
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def replacing(path, sync: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write; when the block ends without an
    error, rename it over ``path`` (``sync``: flush it to the disk first). A reader, or a
    process killed at any moment, sees the old file or the new one, never a part; on an
    error the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        if sync:
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
