"""fairseq adapters. Importing this package (``--user-dir fairseq_sret`` does) registers the
SReT architectures with fairseq and applies the fixes of :mod:`fairseq_sret.fairseq_patches`."""

from ..fairseq_patches import apply_patches

apply_patches()

from . import sret_transformer  # noqa: E402,F401  (registers the model and its architectures)
