"""Writes that a reader, or a process killed at any moment, sees whole or not at all.

Standard library only: the fairseq plugin (checkpoint copies), the checkpoint helpers and
the experiment runner (results, run records) share it.
"""

import contextlib
import errno
import os
from pathlib import Path
from typing import Iterator, Optional


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
    except (OSError, RuntimeError) as exc:
        full = disk_full(exc, tmp)
        if full is None:
            raise
        raise full from None
    finally:
        if tmp.exists():
            tmp.unlink()


#: what the file system says of a full disk or an exhausted quota
FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException, path) -> Optional[OSError]:
    """The error to raise instead of ``exc`` when it is a write that failed for want of space
    (``ENOSPC``/``EDQUOT``, a library's error that says so, or torch's serializer failing where
    the disk is full: it names no errno), naming ``path`` without its temporary suffix; None
    for any other error."""
    path = Path(path)
    shown = path.with_name(path.name[1:].rsplit(".", 2)[0]) if path.name.endswith(".tmp") else path
    text = str(exc)
    if isinstance(exc, OSError) and exc.errno in FULL:
        code = exc.errno
    elif "No space left on device" in text or "os error 28" in text:  # a library's own error (safetensors)
        code = errno.ENOSPC
    elif "Disk quota exceeded" in text or "os error 122" in text:
        code = errno.EDQUOT
    elif isinstance(exc, RuntimeError) and ("inline_container" in text or "PytorchStreamWriter" in text):
        if "open file failed" in text:  # the file could not be made at all: its reason is in the text
            return None
        try:
            stats = os.statvfs(path.parent)
        except OSError:
            return None
        if stats.f_blocks == 0 or stats.f_bavail * stats.f_frsize >= 1 << 20:  # no disk (/proc), or space left
            return None
        code = errno.ENOSPC
    else:
        return None
    what = "the disk quota is exhausted" if code == errno.EDQUOT else "no space left on the device"
    return OSError(code, f"{what}: it was not written (a file already there is kept as it was); free some"
                         " space, or write elsewhere", str(shown))
