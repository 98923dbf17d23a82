"""fairseq adapters. Importing this package (``--user-dir fairseq_sret`` does) registers the
SReT architectures and the mixed-depth criterion with fairseq and applies the fixes of
:mod:`fairseq_sret.fairseq_patches`."""

from ..fairseq_patches import apply_patches

apply_patches()

from . import sret_transformer  # noqa: E402,F401  (registers the model and its architectures)
from . import mixed_depth  # noqa: E402,F401  (registers the mixed-depth criterion)
