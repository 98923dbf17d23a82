"""fairseq-sret: the Sliced Recursive Transformer (SReT, Shen, Liu, Xing, ECCV 2022).

``fairseq_sret.core`` and ``fairseq_sret.vision`` are pure PyTorch. When fairseq is
installed, importing this package (or passing ``--user-dir fairseq_sret`` to fairseq's
command-line tools) also registers the SReT translation models with fairseq.
"""

import importlib.util

__version__ = "0.1.0"


def _fairseq_installed() -> bool:
    try:
        return importlib.util.find_spec("fairseq") is not None
    except (ImportError, ValueError):  # e.g. sys.modules["fairseq"] = None to hide it
        return False


if _fairseq_installed():
    from . import models  # noqa: F401  (registers the fairseq architectures)
