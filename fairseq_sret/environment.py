"""Switches read from the environment, one reading for all of them: ``1``, ``yes``, ``true``,
``on`` (any case) and any other value turn a switch on; unset, empty, ``0``, ``no``, ``false``
and ``off`` leave it off (so ``SRET_TRACEBACK=0`` and ``SRET_DISABLE_TRITON=false`` mean off).
"""

import os

OFF = ("", "0", "no", "false", "off")


def switched_on(name: str) -> bool:
    """Does the environment variable ``name`` turn its switch on?"""
    return os.environ.get(name, "").strip().lower() not in OFF
