"""JSON as every file and report of the project writes it: strict JSON (RFC 8259), which every
reader accepts. Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which are not
JSON; here a float that is not finite (a diverged loss, an undefined ratio) is written as
``null``, and anything else ``json`` cannot write is an error, as with ``json.dumps``.
"""

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every float that is NaN or infinite, at any depth of its dicts, lists and
    tuples, replaced by None (JSON's null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value: Any, **kwargs) -> str:
    """``json.dumps`` that writes only JSON (see the module docstring); keyword arguments as
    ``json.dumps``'s. With ``ensure_ascii=False``, text that holds a lone surrogate (a file name
    whose bytes are not UTF-8, as Python reads it) is written with ``\\u`` escapes instead,
    since no UTF-8 file or stream could hold it."""
    text = json.dumps(finite(value), allow_nan=False, **kwargs)
    if kwargs.get("ensure_ascii", True) is False:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(finite(value), allow_nan=False, **dict(kwargs, ensure_ascii=True))
    return text
