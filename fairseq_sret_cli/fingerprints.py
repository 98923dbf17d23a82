"""Fingerprints of data, and the one check that a recorded result was computed from the data
given now.

A fingerprint reads all of what it describes: :func:`file_digest` hashes a file's every byte
(in chunks, cached per process by path, size and modification time), so a corpus or a
data-bin edited in place, whatever its size, gets another fingerprint. Fingerprints of this
format start with :data:`FULL`; those recorded before (16 hex digits, of names and sizes or of
a file's first and last MiB) are :func:`legacy`: a reader that meets one compares it with the
old fingerprint of the data, said where it does.

:func:`data_difference` is the check every reuse of a recorded result goes through
(sret-experiments' translation and image runs, their reports, the benchmarks' figures).
"""

import hashlib
import os
from stat import S_ISREG
from typing import Callable, Dict, Mapping, Optional, Tuple

#: the prefix of fingerprints that read every byte of their data
FULL = "sha256:"
_CHUNK = 1 << 22
_digests: Dict[Tuple[str, int, int], str] = {}


def file_digest(path) -> str:
    """sha256 (hex) of every byte of the file ``path``; cached by (real path, size, mtime_ns).
    ValueError for what is not a regular file (a pipe would be waited on, not read)."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    if not S_ISREG(stat.st_mode):
        raise ValueError(f"{path}: not a regular file (a pipe, a device or a folder): data is read from files")
    key = (real, stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with open(real, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        _digests[key] = digest.hexdigest()
    return _digests[key]


def full(digest) -> str:
    """A fingerprint of the current format from a finished ``hashlib`` object."""
    return FULL + digest.hexdigest()[:16]


def legacy(fingerprint) -> bool:
    """Whether ``fingerprint`` was recorded before fingerprints read all of their data."""
    return isinstance(fingerprint, str) and not fingerprint.startswith(FULL)


def data_difference(recorded: Optional[Mapping], now: Mapping,
                    legacy_now: Optional[Callable[[], Mapping]] = None) -> Optional[str]:
    """None when the data fingerprints a result records (``recorded``: name -> fingerprint) are
    those of the data given now (``now``); else what differs, in words. A recorded fingerprint
    of the old format is compared with ``legacy_now()`` (the old fingerprints of the data now),
    and is a difference where there is none."""
    if not isinstance(recorded, Mapping) or not recorded:
        return "it records no fingerprints of its data"
    old = None
    differ = []
    for name in sorted(set(recorded) | set(now)):
        mine, theirs = recorded.get(name), now.get(name)
        if legacy(mine) and legacy_now is not None:
            old = old if old is not None else legacy_now()
            theirs = old.get(name)
        if mine != theirs:
            differ.append(f"{name} {mine} -> {theirs}")
    return f"its data fingerprints differ ({'; '.join(differ)})" if differ else None
