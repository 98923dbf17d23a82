"""The user commands of fairseq-sret, installed as console entry points by ``setup.py``.

Each is also runnable as ``python -m fairseq_sret_cli.<module>``:

======================================  =========================================
command                                 module
======================================  =========================================
``sret-prepare multi30k|iwslt14|wmt14`` :mod:`fairseq_sret_cli.prepare`
``sret-evaluate``                       :mod:`fairseq_sret_cli.evaluate`
``sret-average-checkpoints``            :mod:`fairseq_sret_cli.average_checkpoints`
``sret-plot-lrc``                       :mod:`fairseq_sret_cli.plot_lrc`
``sret-train-vision``                   :mod:`fairseq_sret_cli.train_vision`
``sret-train-cifar``                    :mod:`fairseq_sret_cli.train_cifar`
``sret-count vision|nmt``               :mod:`fairseq_sret_cli.count`
``sret-toy-data``                       :mod:`fairseq_sret_cli.toy`
``sret-uptrain``                        :mod:`fairseq_sret_cli.uptrain`
======================================  =========================================
"""

import argparse
import contextlib
from typing import Iterator, Optional


def log(message: str, stage: str) -> None:
    """A progress line on stderr, ``[stage] message``, flushed so that piped logs show it at once.
    Each part of the lab binds its stage once (``log = functools.partial(log, stage="prepare")``)."""
    import sys

    print(f"[{stage}] {message}", file=sys.stderr, flush=True)


def pyplot():
    """matplotlib's ``pyplot`` drawing to files (the Agg backend), with matplotlib's and PIL's
    loggers at WARNING before the import: fairseq's import leaves the root logger at DEBUG, and
    matplotlib logs its set-up while it is imported."""
    import logging

    for name in ("matplotlib", "PIL"):
        logging.getLogger(name).setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks (its examples)."""


class UserError(Exception):
    """A mistake in what the user asked for; the command prints its message and exits 1."""


class UsageError(UserError):
    """A command line that cannot be carried out as given (an option out of range, an output
    in the way); the command prints its message and exits 2, as argparse does."""


#: what each command's one line says after Ctrl-C, by default
INTERRUPTED = "interrupted; nothing was left half-written (outputs are replaced in one rename): rerun to finish"


def user_errors(prog: str, interrupted: str = INTERRUPTED):
    """Decorate a command's ``main``: a user's mistake prints one line, ``PROG: error: ...``,
    and returns 1 (2 for a :class:`UsageError`) instead of a traceback; Ctrl-C prints
    ``PROG: interrupted...`` (``interrupted``: what to do next) and returns 130, SIGTERM the
    same and 143, after the command's clean-up ran.

    Mistakes are :class:`UserError`, files that are missing, unreadable or in the way
    (``OSError``), values that do not fit (``ValueError``, which covers text that is not
    UTF-8 and our experiment-file errors), keys a checkpoint lacks (``KeyError``) and damaged
    or unsafe checkpoints; an optional dependency that is not installed is named with its
    extra (:mod:`fairseq_sret.extras`). ``SRET_TRACEBACK=1`` in the environment shows the
    traceback instead (``0``, ``false``, ``no``, ``off`` or empty do not).
    """
    import functools
    import signal
    import sys

    def decorate(main):
        @functools.wraps(main)
        def wrapper(*args, **kwargs):
            from fairseq_sret.checkpoints import CorruptCheckpointError, UnsafeCheckpointError

            # SIGTERM (kill, a scheduler, a runner stopping its children) as Ctrl-C: the command's
            # clean-up runs (staging folders, temporary files, children) instead of an abrupt end
            with sigterm_as_interrupt():
                try:
                    return main(*args, **kwargs)
                except (UserError, OSError, ValueError, KeyError, CorruptCheckpointError, UnsafeCheckpointError) as exc:
                    if tracebacks_wanted():
                        raise
                    print(f"{prog}: error: {error_message(exc)}", file=sys.stderr)
                    return 2 if isinstance(exc, UsageError) else 1
                except (MemoryError, RuntimeError) as exc:
                    message = out_of_memory_message(exc)
                    if message is None or tracebacks_wanted():
                        raise
                    print(f"{prog}: error: {message}", file=sys.stderr)
                    return 1
                except ModuleNotFoundError as exc:
                    from fairseq_sret.extras import missing_extra_message

                    message = missing_extra_message(exc)
                    if message is None or tracebacks_wanted():
                        raise
                    print(f"{prog}: error: {message}", file=sys.stderr)
                    return 1
                except KeyboardInterrupt as exc:
                    if tracebacks_wanted():
                        raise
                    print(f"\n{prog}: {interrupted}", file=sys.stderr)
                    return 128 + signal.SIGTERM if isinstance(exc, Terminated) else 130

        return wrapper

    return decorate


class Terminated(KeyboardInterrupt):
    """SIGTERM, which :func:`user_errors` turns into this so that it ends a command as Ctrl-C
    does (exit 143 instead of 130)."""


def _terminated(signum, frame):
    raise Terminated(f"signal {signum}")


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``), so that
    ``kill`` ends the work as Ctrl-C does, clean-up included; the previous handler after it.
    Only the main thread receives signals: elsewhere the block runs unchanged."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:  # None: a handler not set from Python, i.e. the default one
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def tracebacks_wanted() -> bool:
    """Does ``SRET_TRACEBACK`` ask for tracebacks? ``1``/``yes``/``true`` do; unset, empty, ``0``,
    ``no``, ``false`` and ``off`` do not (:mod:`fairseq_sret.environment`)."""
    from fairseq_sret.environment import switched_on

    return switched_on("SRET_TRACEBACK")


def out_of_memory_message(exc: BaseException) -> Optional[str]:
    """One line for an allocation that failed (Python's ``MemoryError``, torch's allocators),
    None for any other error."""
    import re

    text = str(exc)
    if not isinstance(exc, MemoryError) and not re.search(r"can't allocate memory|out of memory", text, re.I):
        return None
    size = re.search(r"allocate (\d+) bytes", text)
    asked = f": it asked for {int(size.group(1)) / 2 ** 30:,.1f} GiB" if size else ""
    return (f"not enough memory{asked}; give smaller sizes (of the model, a batch, or an option that scales one,"
            " such as a width or ratio)")


def error_message(exc: BaseException) -> str:
    """One line naming the problem (a ``KeyError``'s bare key gets a word of context; the
    error of a worker process is its own message, not the worker's traceback)."""
    import errno

    if isinstance(exc, KeyError) and len(exc.args) == 1 and not str(exc.args[0]).count(" "):
        text = f"missing entry {exc.args[0]!r}"
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    elif isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):  # a write that names no file
        text = (f"{'the disk quota is exhausted' if exc.errno == errno.EDQUOT else 'no space left on the device'}"
                " while writing the outputs (files already there are replaced only by whole new ones); free some"
                " space, or write elsewhere")
    else:
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    # a worker's traceback starts its own line, a DataLoader worker's after "Original "
    tracebacks = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if tracebacks:  # a worker's or a subprocess's traceback in the message: its own error, not its frames
        lines = lines[: tracebacks[0]] + lines[-1:]
    return " ".join(lines) or type(exc).__name__


def at_least(minimum, kind=int):
    """An argparse ``type``: a ``kind`` number >= ``minimum`` (a count of 0 or -5 is refused
    by name instead of doing nothing, or the wrong thing); a float must also be :func:`finite`."""

    def parse(text: str):
        if kind is float:  # infinity: a rate or a count of epochs that no step can use
            value = finite(text)
        else:
            try:
                value = kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value

    parse.__name__ = f"{kind.__name__} >= {minimum}"
    return parse


def seed(text: str) -> int:
    """An argparse ``type``: a random seed, an integer from 0 to 2**32 - 1 (what every generator
    the commands seed takes, numpy's included)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    if not 0 <= value < 2 ** 32:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to {2 ** 32 - 1}, got {text}")
    return value


def finite(text: str) -> float:
    """An argparse ``type``: a finite number (NaN and infinity are refused, not passed on)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def in_range(low: float, high: float):
    """An argparse ``type``: a number in [``low``, ``high``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        if not low <= value < high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}), got {text}")
        return value

    parse.__name__ = f"number in [{low}, {high})"
    return parse
