"""The user commands of fairseq-sret, installed as console entry points by ``setup.py``.

Each is also runnable as ``python -m fairseq_sret.cli.<module>``:

======================================  =========================================
command                                 module
======================================  =========================================
``sret-prepare multi30k|iwslt14|wmt14`` :mod:`fairseq_sret.cli.prepare`
``sret-evaluate``                       :mod:`fairseq_sret.cli.evaluate`
``sret-average-checkpoints``            :mod:`fairseq_sret.cli.average_checkpoints`
``sret-plot-lrc``                       :mod:`fairseq_sret.cli.plot_lrc`
``sret-train-vision``                   :mod:`fairseq_sret.cli.train_vision`
``sret-count vision|nmt``               :mod:`fairseq_sret.cli.count`
``sret-toy-data``                       :mod:`fairseq_sret.toy_data`
``sret-uptrain``                        :mod:`fairseq_sret.cli.uptrain`
``sret-export-hf``                      :mod:`fairseq_sret.cli.export_hf`
======================================  =========================================
"""

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks (its examples)."""


class UserError(Exception):
    """A mistake in what the user asked for; the command prints its message and exits 1."""


def user_errors(prog: str):
    """Decorate a command's ``main``: a user's mistake prints one line, ``PROG: error: ...``,
    and returns 1 instead of a traceback.

    Mistakes are :class:`UserError`, files that are missing, unreadable or in the way
    (``OSError``), values that do not fit (``ValueError``, which covers text that is not
    UTF-8 and our experiment-file errors), keys a checkpoint lacks (``KeyError``) and damaged
    or unsafe checkpoints. ``SRET_TRACEBACK=1`` in the environment shows the traceback instead.
    """
    import functools
    import os
    import sys

    def decorate(main):
        @functools.wraps(main)
        def wrapper(*args, **kwargs):
            from ..nmt_checkpoints import CorruptCheckpointError, UnsafeCheckpointError

            try:
                return main(*args, **kwargs)
            except (UserError, OSError, ValueError, KeyError, CorruptCheckpointError, UnsafeCheckpointError) as exc:
                if os.environ.get("SRET_TRACEBACK"):
                    raise
                print(f"{prog}: error: {error_message(exc)}", file=sys.stderr)
                return 1

        return wrapper

    return decorate


def error_message(exc: BaseException) -> str:
    """One line naming the problem (a ``KeyError``'s bare key gets a word of context)."""
    if isinstance(exc, KeyError) and len(exc.args) == 1 and not str(exc.args[0]).count(" "):
        text = f"missing entry {exc.args[0]!r}"
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " ".join(lines) or type(exc).__name__
