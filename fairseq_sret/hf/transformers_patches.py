"""Every change fairseq-sret makes to transformers' behaviour, as for fairseq
(:mod:`fairseq_sret.patching`): one patch per defect, probed, recorded, removable.
:func:`apply_patches` runs when :mod:`fairseq_sret.hf` is imported, before transformers'
pipelines are; ``SRET_TRANSFORMERS_PATCHES`` chooses what may be applied (``all``, ``none`` or
``-name``), one log line says what was done (``fairseq_sret.hf.transformers_patches`` logger,
level INFO). docs/fairseq_patches.md lists them beside fairseq's.
"""

import importlib.util
import logging
from typing import Dict

from ..patching import Installation, Patch, PatchSet

logger = logging.getLogger(__name__)

PATCHES_ENV = "SRET_TRANSFORMERS_PATCHES"
AVAILABLE = ("transformers.utils.is_torchaudio_available", "transformers.utils.import_utils.is_torchaudio_available")


def torchaudio_installed_but_unimportable() -> bool:
    """The probe: a torchaudio package is installed but fails to import (built against another
    torch: fairseq-fixed, the ``fairseq`` extra, requires torchaudio, whose wheels follow a
    CUDA torch). transformers judges torchaudio by its installed package and imports it with
    its pipelines and audio helpers, so every pipeline would fail to import."""
    if importlib.util.find_spec("torchaudio") is None:
        return False
    try:
        import torchaudio  # noqa: F401
    except (ImportError, OSError):
        return True
    return False


def _unavailable() -> bool:
    return False


def hide_torchaudio(installation: Installation) -> None:
    """transformers is told that torchaudio is absent (nothing here uses audio)."""
    import transformers.utils
    import transformers.utils.import_utils

    installation.replace(transformers.utils, "is_torchaudio_available", _unavailable)
    installation.replace(transformers.utils.import_utils, "is_torchaudio_available", _unavailable)


PATCHES = (
    Patch("unimportable_torchaudio", "transformers imports an installed torchaudio that fails to import"
          " (built for another torch) with every pipeline, which then fails too",
          torchaudio_installed_but_unimportable, hide_torchaudio, replaces=AVAILABLE),
)

#: transformers' patches, in installation order
TRANSFORMERS_PATCHES = PatchSet("transformers", PATCHES, PATCHES_ENV, logger, "docs/fairseq_patches.md")


def apply_patches() -> Dict[str, str]:
    """Probe the installed packages and install the patches they need (once per process)."""
    return TRANSFORMERS_PATCHES.apply()
