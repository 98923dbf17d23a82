"""Fetching the official archives (with progress) and unpacking them."""

import tarfile
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Sequence

from .io import log


class DownloadError(RuntimeError):
    pass


def download(urls: Sequence[str], dest, timeout: float = 30.0) -> Path:
    """Download the first URL of ``urls`` that works to ``dest`` (kept if already there).

    Raises :class:`DownloadError` with a message that says how to use a local copy
    instead when no URL can be reached (e.g. offline).
    """
    dest = Path(dest)
    if dest.is_file() and dest.stat().st_size > 0:
        log(f"using already downloaded {dest}")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for url in urls:
        log(f"downloading {url}")
        tmp = dest.with_name(dest.name + ".part")
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as out:
                total = int(response.headers.get("Content-Length") or 0)
                done, last = 0, 0.0
                while True:
                    block = response.read(1 << 20)
                    if not block:
                        break
                    out.write(block)
                    done += len(block)
                    if time.time() - last > 5:
                        last = time.time()
                        pct = f" ({100 * done / total:.0f}%)" if total else ""
                        log(f"  {done / 2**20:.1f} MiB{pct}")
            tmp.replace(dest)
            log(f"  saved {dest} ({dest.stat().st_size / 2**20:.1f} MiB)")
            return dest
        except (urllib.error.URLError, OSError, ValueError) as exc:
            errors.append(f"{url}: {exc}")
            tmp.unlink(missing_ok=True)
    raise DownloadError(
        f"could not download {dest.name}:\n  " + "\n  ".join(errors) + "\n"
        "If this machine is offline, download the file elsewhere (or use a copy you already "
        "have) and pass the folder that holds it (or its extracted files) with --src DIR."
    )


def archive_identity(archive: Path) -> str:
    """The archive's size and the sha256 of all its bytes (:mod:`fairseq_sret_cli.fingerprints`):
    another file under the same name (a new download, a replaced copy) differs."""
    from ..fingerprints import file_digest

    return f"{archive.stat().st_size} {file_digest(archive)}\n"


def extract(archive, dest) -> Path:
    """Unpack a .tgz/.tar.gz/.tar archive into ``dest``, once per archive: a marker file
    records the archive it unpacked (:func:`archive_identity`), and an archive replaced since
    is unpacked again over the old files."""
    archive, dest = Path(archive), Path(dest)
    marker = dest / f".extracted-{archive.name}"
    identity = archive_identity(archive)
    if marker.exists() and marker.read_text(encoding="utf-8") == identity:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    log(f"extracting {archive.name}" + (" (the archive changed since it was last extracted)" if marker.exists() else ""))
    marker.unlink(missing_ok=True)
    try:
        with tarfile.open(archive) as tar:
            try:
                tar.extractall(dest, filter="data")
            except TypeError:  # Python without extraction filters
                tar.extractall(dest)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise ValueError(f"{archive}: damaged or truncated archive ({exc})") from None
    marker.write_text(identity, encoding="utf-8")
    return dest


def is_archive(path) -> bool:
    name = Path(path).name
    return name.endswith((".tgz", ".tar.gz", ".tar"))
