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
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from fairseq_sret.atomic_files import disk_full, replacing

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


# ---------------------------------------------------------------- one writer at a time
_held: Dict[str, dict] = {}  # folder -> {"lock": RLock, "depth": nesting, "fd": the flock-ed folder}
_held_guard = threading.Lock()


@contextlib.contextmanager
def locked(path) -> Iterator[None]:
    """Hold the lock of ``path``'s folder while the block reads and rewrites ``path`` (a results
    file, the manifest, an output another process may write at the same time): other processes
    (``flock`` on the folder itself: no lock file, released when the process ends, also when it
    is killed) and other threads wait. Nested blocks of one thread on one folder take it once.
    The folder is made if need be; one that cannot be is not locked (nothing can be written there)."""
    folder = os.path.realpath(Path(path).parent)
    with _held_guard:
        held = _held.setdefault(folder, {"lock": threading.RLock(), "depth": 0, "fd": None})
    with held["lock"]:
        if held["depth"] == 0:
            try:
                os.makedirs(folder, exist_ok=True)
                held["fd"] = os.open(folder, os.O_RDONLY)
            except OSError:
                held["fd"] = None
            if held["fd"] is not None:
                fcntl.flock(held["fd"], fcntl.LOCK_EX)
        held["depth"] += 1
        try:
            yield
        finally:
            held["depth"] -= 1
            if held["depth"] == 0 and held["fd"] is not None:
                os.close(held["fd"])  # releases the flock
                held["fd"] = None


# ---------------------------------------------------------------- the manifest of a folder


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
    with locked(folder / MANIFEST):
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
        folders, replaced = list(folders), list(replaced)
        for folder in folders + replaced:  # a run killed while it started over: the old one is put back first
            restore_replaced(folder)
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
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            yield tmp
            # checked again under the folder's lock, with the rename and the record: another
            # process may have written ``path`` since the check above (two commands, one output)
            with locked(path):
                self.check([path], own=own)
                os.replace(tmp, path)
                self.record(path)
        except (OSError, RuntimeError) as exc:
            full = disk_full(exc, tmp)
            if full is not None:
                raise full from None
            # torch.save's "open file failed" names no file
            if isinstance(exc, RuntimeError) and ("open file failed" in str(exc) or "PytorchStreamWriter" in str(exc)):
                raise OSError(errno.EACCES, f"cannot write the file ({str(exc).splitlines()[0][:120]})",
                              str(path)) from None
            raise
        finally:
            if os.path.lexists(tmp):
                tmp.unlink()

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
        with locked(target):
            self.check([target])
            os.replace(source, target)
            self.record(target)
        return target

    @contextlib.contextmanager
    def starting_over(self, folder, names: Iterable[str]) -> Iterator[Callable[[], None]]:
        """Start a run over in ``folder`` (``--force`` over an earlier run whose files are
        ``names``): the old files are moved aside (into ``folder/.sret-replaced``) while the
        block runs, and the block gets ``made()``, to call once the new run has written its
        own files (its first checkpoint and log): the old ones are then deleted. Until then
        any failure (an error, Ctrl-C, SIGTERM) puts the old files back as they were, and
        removes what the new run wrote of those names, so a new run that fails at once never
        costs the old one; a kill is repaired by the next command that checks or locks the
        folder (:func:`restore_replaced`). A block that ends without ``made()`` counts as made."""
        folder = Path(folder)
        restore_replaced(folder, locked_by_me=True)  # a kill's leftovers first
        done = [False]

        def made() -> None:
            if not done[0]:
                done[0] = True
                drop_replaced(folder)

        try:
            set_aside(folder, names)
            yield made
        except BaseException:
            if not done[0]:
                restore_replaced(folder, locked_by_me=True)
            raise
        made()

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


#: where :meth:`Outputs.starting_over` keeps an old run's files until the new run has made its own
ASIDE = ".sret-replaced"
ABOUT = ".about.json"  # in ASIDE: the run's file names and their manifest entries


def set_aside(folder, names: Iterable[str]) -> List[str]:
    """Move an earlier run's files and folders ``names`` of ``folder`` into ``folder/ASIDE``
    (with their manifest entries), for :func:`restore_replaced` to put back or
    :func:`drop_replaced` to delete once the new run has made its own; returns those moved."""
    folder, names = Path(folder), list(names)
    present = [name for name in names if _lexists(folder / name)]
    if not present:
        return []
    aside = folder / ASIDE
    manifest = read_manifest(folder)
    aside.mkdir(exist_ok=True)
    (aside / ABOUT).write_text(json_text.dumps({"names": names, "manifest": {
        name: manifest[name] for name in names if name in manifest}}), encoding="utf-8")
    for name in present:
        os.replace(folder / name, aside / name)
    return present


def drop_replaced(folder) -> None:
    """The new run has made its files: delete the earlier run's that :func:`set_aside` kept."""
    shutil.rmtree(Path(folder) / ASIDE, ignore_errors=True)


def restore_replaced(folder, locked_by_me: bool = False) -> bool:
    """Put back the old run's files that :meth:`Outputs.starting_over` moved aside in
    ``folder`` when the new run did not make its own (it was killed): the new run's files of
    those names are removed, the old ones and their manifest entries restored. Only while no
    process holds the folder's lock (``locked_by_me``: this one does). Returns whether it did."""
    folder = Path(folder)
    aside = folder / ASIDE
    if not aside.is_dir():
        return False
    handle = None
    if not locked_by_me:  # a process at work in the folder owns what is aside
        try:
            handle = open(folder / ".sret-lock", "a+", encoding="utf-8")
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if handle is not None:
                handle.close()
            return False
    try:
        try:
            about = json.loads((aside / ABOUT).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            about = {"names": [p.name for p in aside.iterdir() if p.name != ABOUT], "manifest": {}}
        names = [name for name in about.get("names", []) if isinstance(name, str) and "/" not in name]
        for name in names:  # what the new run wrote of these names is its own: it goes
            if (folder / name).is_dir() and not (folder / name).is_symlink():
                shutil.rmtree(folder / name)
            elif _lexists(folder / name):
                (folder / name).unlink()
            if _lexists(aside / name):
                os.replace(aside / name, folder / name)
        entries = about.get("manifest") or {}
        now = read_manifest(folder)
        if any(now.get(name) != entries.get(name) for name in names):  # the new run recorded files

            def put_back(files: Dict[str, dict]) -> None:
                for name in names:
                    if name in entries:
                        files[name] = entries[name]
                    else:
                        files.pop(name, None)

            try:
                _update_manifest(folder, put_back)
            except OSError:  # a full disk: the files are back; their entries may name the new run
                pass  # (a mismatch only makes the next command ask for --force)
        shutil.rmtree(aside, ignore_errors=True)
        return True
    finally:
        if handle is not None:
            handle.close()


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
        try:  # who holds it, for the refusal of a second process (unbuffered: a full disk only loses the name)
            os.ftruncate(handle.fileno(), 0)
            os.pwrite(handle.fileno(), f"{command} (pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')})\n"
                      .encode("utf-8"), 0)
        except OSError:
            pass
        restore_replaced(folder, locked_by_me=True)  # a run killed while it started over
        try:
            yield path
        finally:
            if remove:
                path.unlink(missing_ok=True)
                if made and not any(folder.iterdir()):
                    folder.rmdir()
    finally:
        handle.close()
