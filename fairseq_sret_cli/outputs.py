"""The one rule of every command that writes files: nothing a user has is ever lost.

A command

- never replaces or deletes a file or folder it did not make, unless ``--force``;
- never replaces one of its own inputs, not even with ``--force`` (a symbolic or hard link
  to an input is the input);
- says what is in the way, and how to go on, instead (exit 2);
- writes every file atomically (:func:`fairseq_sret.atomic_files.replacing`): a reader, or a
  command killed at any moment, sees the old file or the new one, never a part.

What a command made is listed in ``.sret-outputs.json`` in the folder it wrote to: each file
name with the command and the settings it was made with. The same command with the same
settings replaces its own files (running it again refreshes them); a file made by another
command, or by this one with other settings (another beam, another vocabulary), is in the way
like a file the user made. A file that carries its own mark (a results file naming its
experiment) can be recognised by its content instead (``own=``).

    outputs = Outputs("sret-toy-data", force=args.force, settings={"seed": args.seed})
    outputs.check([folder / "train.src", folder / "train.tgt"])   # everything in the way, at once
    with outputs.writing(folder / "train.src") as tmp:
        tmp.write_text(text)
"""

import contextlib
import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from fairseq_sret.atomic_files import replacing

from . import UsageError
from fairseq_sret import json_text

MANIFEST = ".sret-outputs.json"

Owner = Callable[[Path], bool]


class OutputInTheWay(UsageError):
    """Files or folders a command would replace against the rule; the message lists them."""


def identity(path) -> Optional[Tuple[int, int]]:
    """(device, inode) of what ``path`` leads to (links followed), None if nothing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _lexists(path: Path) -> bool:
    return os.path.lexists(path)


# ---------------------------------------------------------------- the manifest of a folder
@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` while its manifest is read and rewritten."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_manifest(folder) -> Dict[str, dict]:
    """``{file name: {"command", "settings", "time"}}`` of ``folder`` ({} if none or unreadable:
    then nothing there counts as made by a command)."""
    path = Path(folder) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return files if isinstance(files, dict) else {}


def _update_manifest(folder: Path, change: Callable[[Dict[str, dict]], None]) -> None:
    with _folder_lock(folder):
        files = read_manifest(folder)
        change(files)
        text = json_text.dumps({"about": "files made by the sret-* commands (fairseq_sret_cli/outputs.py)",
                           "files": files}, indent=1, sort_keys=True) + "\n"
        with replacing(folder / MANIFEST) as tmp:
            tmp.write_text(text, encoding="utf-8")


def maker(path) -> Optional[dict]:
    """The manifest entry of ``path`` (who made it, with which settings), or None."""
    path = Path(path)
    return read_manifest(path.parent).get(path.name)


def _settings_text(settings: dict, keys) -> str:
    def shown(value):
        if isinstance(value, str) and os.path.isabs(value):  # paths as the user gives them
            relative = os.path.relpath(value)
            return relative if not relative.startswith("..") else value
        return value

    return ", ".join(f"{k}={shown(settings.get(k))!r}" for k in keys)


# ---------------------------------------------------------------- the rule
class Outputs:
    """What one run of ``command`` may write (see the module docstring).

    ``settings``: the options that decide the outputs' content (JSON-able), or None when
    any run of the command may refresh what an earlier one made. ``inputs``: files the
    command reads (never written, not even with ``force``); folders count as every file in them.
    """

    def __init__(self, command: str, *, force: bool = False, settings: Optional[dict] = None, inputs=()):
        self.command, self.force, self.settings = command, force, settings
        self._inputs: Dict[Tuple[int, int], Path] = {}
        self.add_inputs(*inputs)

    def add_inputs(self, *paths) -> None:
        """Files the command reads; a folder counts as every file in it (the folder itself
        may be written into: new files replace nothing)."""
        for path in paths:
            if path is None:
                continue
            path = Path(path)
            if path.is_dir():
                for root, _, files in os.walk(path):
                    for name in files:
                        self._remember_input(Path(root) / name)
            else:
                self._remember_input(path)

    def _remember_input(self, path: Path) -> None:
        key = identity(path)
        if key is not None:
            self._inputs.setdefault(key, path)

    def input_at(self, path) -> Optional[Path]:
        """The input that ``path`` is (through links), or None."""
        key = identity(path)
        return None if key is None else self._inputs.get(key)

    def made_by_me(self, path, own: Optional[Owner] = None) -> bool:
        """Did this command make ``path`` with these settings (its manifest entry, or ``own``)?"""
        path = Path(path)
        if own is not None and own(path):
            return True
        entry = maker(path)
        if not entry or entry.get("command") != self.command:
            return False
        return self.settings is None or entry.get("settings") == self.settings

    def in_the_way(self, path, *, folder: bool = False, own: Optional[Owner] = None) -> Optional[str]:
        """Why this command may not write ``path`` (a file, or with ``folder`` a folder it
        fills), or None when it may."""
        problem = self._problem(Path(path), folder, own)
        return None if problem is None else refusal([(Path(path), *problem)], fix="-")[:-3]

    def _problem(self, path: Path, folder: bool, own: Optional[Owner],
                 replace: bool = False) -> Optional[Tuple[str, bool]]:
        """(why, said after the path; whether ``--force`` would allow it), or None. A folder
        (``folder``) is filled, so any folder may be, unless it is to be ``replace``-d whole."""
        source = self.input_at(path)
        if source is not None:
            same = "" if os.path.abspath(source) == os.path.abspath(path) else f" ({source})"
            return f"an input of this command{same}", False
        if not _lexists(path):
            reason = _unwritable(path)
            return None if reason is None else (reason, False)
        if folder:
            if not path.is_dir():
                return "a file, not a folder", False
            if not replace:
                return None
        elif path.is_dir() and not path.is_symlink():
            return "a folder (give the path of a file)", False
        if self.force or self.made_by_me(path, own):
            return None
        entry = maker(path)
        if entry and entry.get("command") == self.command:
            old, new = entry.get("settings") or {}, self.settings or {}
            changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            return (f"made by {self.command} with other settings ({_settings_text(old, changed)};"
                    f" now {_settings_text(new, changed)})"), True
        if entry:
            return f"made by {entry.get('command')}", True
        return f"exists, not made by {self.command}", True

    def check(self, paths: Iterable, *, fix: str = "", folders: Iterable = (), replaced: Iterable = (),
              own: Optional[Owner] = None) -> None:
        """Raise :class:`OutputInTheWay` naming everything among ``paths`` (files), ``folders``
        (to be filled) and ``replaced`` (folders the command empties and fills again, like a
        file it replaces) that this command may not write, and the fix."""
        problems = [(Path(f), *p) for f in folders for p in [self._problem(Path(f), True, None)] if p]
        problems += [(Path(f), *p) for f in replaced for p in [self._problem(Path(f), True, None, replace=True)] if p]
        problems += [(Path(f), *p) for f in paths for p in [self._problem(Path(f), False, own)] if p]
        if problems:
            raise OutputInTheWay(refusal(problems, fix))

    # ------------------------------------------------------------ writing
    @contextlib.contextmanager
    def writing(self, path, own: Optional[Owner] = None) -> Iterator[Path]:
        """Check ``path``, then yield a temporary path beside it to write; when the block ends
        it replaces ``path`` in one rename and is recorded as made by this command."""
        path = Path(path)
        self.check([path], own=own)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with replacing(path) as tmp:
                yield tmp
        except RuntimeError as exc:  # torch.save's "open file failed" names no file
            if "open file failed" in str(exc) or "PytorchStreamWriter" in str(exc):
                raise OSError(errno.EACCES, f"cannot write the file ({str(exc).splitlines()[0][:120]})",
                              str(path)) from None
            raise
        self.record(path)

    def write_text(self, path, text: str, own: Optional[Owner] = None) -> Path:
        with self.writing(path, own=own) as tmp:
            tmp.write_text(text, encoding="utf-8")
        return Path(path)

    def save(self, state, path) -> Path:
        """``torch.save(state)`` to ``path`` under the rule (checked, atomic, recorded)."""
        import torch

        with self.writing(path) as tmp:
            torch.save(state, str(tmp))
        return Path(path)

    def move_in(self, source, target) -> Path:
        """Move the finished file ``source`` (same file system) to ``target`` in one rename."""
        target = Path(target)
        self.check([target])
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
        self.record(target)
        return target

    def record(self, *paths) -> None:
        """List ``paths`` as made by this command with its settings."""
        by_folder: Dict[Path, List[str]] = {}
        for path in map(Path, paths):
            by_folder.setdefault(path.parent, []).append(path.name)
        entry = {"command": self.command, "settings": self.settings, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
        for folder, names in by_folder.items():
            _update_manifest(folder, lambda files: files.update({name: dict(entry) for name in names}))

    def remove(self, path) -> bool:
        """Delete ``path`` if this command made it (any settings); returns whether it did."""
        path = Path(path)
        entry = maker(path)
        if not entry or entry.get("command") != self.command or self.input_at(path) is not None:
            return False
        path.unlink(missing_ok=True)
        _update_manifest(path.parent, lambda files: files.pop(path.name, None))
        return True


def refusal(problems: List[Tuple[Path, str, bool]], fix: str = "") -> str:
    """One line: the paths in the way grouped by reason (``a/x and 5 more are made by ...``),
    then what to do."""
    groups: Dict[str, List[Path]] = {}
    for path, why, _ in problems:
        groups.setdefault(why, []).append(path)
    parts = []
    for why, paths in groups.items():
        if why.startswith("cannot write"):
            parts.append(why + (f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""))
        else:
            more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
            parts.append(f"{paths[0]}{more}: {why}")
    if not all(forceable for _, _, forceable in problems):
        return "; ".join(parts) + "; choose another output"
    return "; ".join(parts) + "; " + (fix or "choose another output, or pass --force to replace"
                                             f" {'them' if len(problems) > 1 else 'it'} (nothing else is touched)")


def _unwritable(path: Path) -> Optional[str]:
    """Why a new file or folder cannot be made at ``path`` (its nearest existing ancestor is
    a file, or not writable), or None."""
    parent = path.parent
    while not parent.exists():
        if _lexists(parent):  # a dangling link
            return f"cannot write {path}: {parent} is a broken link"
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot write {path}: {parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot write {path}: the folder {parent} is not writable"
    return None


# ---------------------------------------------------------------- one writer per output
class Busy(UsageError):
    """Another process holds the lock of an output folder."""


@contextlib.contextmanager
def exclusive(folder, command: str, remove: bool = False,
              why: str = "two processes on one output would train the same runs at once") -> Iterator[Path]:
    """Hold ``folder/.sret-lock`` (an advisory ``flock``, released when the process ends, also
    by a kill) while the block runs; raise :class:`Busy` naming the holder when another
    process has it. ``remove``: delete the lock file when the block ends (still holding the
    lock), and the folder if the block made it and left it empty: for a folder whose files are
    the user's results. ``why``: what two writers would do, said in the refusal."""
    folder = Path(folder)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".sret-lock"
    handle = open(path, "a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise Busy(f"{folder} is in use by {holder}: wait for it to finish, or give another output folder"
                       f" ({why})") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{command} (pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        handle.flush()
        try:
            yield path
        finally:
            if remove:
                path.unlink(missing_ok=True)
                if made and not any(folder.iterdir()):
                    folder.rmdir()
    finally:
        handle.close()
