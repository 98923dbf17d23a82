"""The ``atomic_checkpoint_copy`` patch: ``fairseq.checkpoint_utils.save_checkpoint`` writes the
first checkpoint of an update atomically, then *copies* it onto the others
(``checkpoint_best.pt``, ``checkpoint_last.pt``) in place: ``fairseq-train`` killed during
that copy leaves a truncated ``checkpoint_last.pt`` or ``checkpoint_best.pt``. Patched: the
copy goes to a temporary file beside the target, which then replaces it.
"""

import os
import tempfile

from fairseq import checkpoint_utils

from ..atomic_files import replacing


class AtomicCopyPathManager:
    """fairseq's ``PathManager`` whose ``copy`` onto a local file writes a temporary file
    beside the target and renames it over the target (a reader, or a process killed at any
    moment, sees the old file or the new one)."""

    sret_patch = "atomic_checkpoint_copy"

    def __init__(self, base):
        self._base = base

    def __getattr__(self, name):
        return getattr(self._base, name)

    def copy(self, src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        folder = os.path.dirname(os.path.abspath(dst_path))
        if "://" in str(dst_path) or not os.path.isdir(folder) or (os.path.exists(dst_path) and not overwrite):
            return self._base.copy(src_path, dst_path, overwrite=overwrite)
        with replacing(dst_path) as tmp:
            copied = self._base.copy(src_path, str(tmp), overwrite=True)
        return copied


def checkpoints_copied_in_place(path_manager=None) -> bool:
    """Does the ``PathManager.copy`` that ``save_checkpoint`` uses write into the existing
    target file (a hard link to the target sees the new content) instead of replacing it?"""
    path_manager = path_manager or checkpoint_utils.PathManager
    with tempfile.TemporaryDirectory() as folder:
        src, dst, link = (os.path.join(folder, name) for name in ("new.pt", "last.pt", "link.pt"))
        for path, text in ((src, "new"), (dst, "old")):
            with open(path, "w") as f:
                f.write(text)
        os.link(dst, link)
        path_manager.copy(src, dst, overwrite=True)
        with open(link) as f:
            return f.read() == "new"


def install(patch) -> None:
    patch.replace(checkpoint_utils, "PathManager", AtomicCopyPathManager(checkpoint_utils.PathManager))
