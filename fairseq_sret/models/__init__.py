"""fairseq adapters: only what fairseq registers. ``--user-dir fairseq_sret`` imports every
module of this folder (``fairseq.models.import_models``); importing it registers the SReT
architectures and the mixed-depth criterion with fairseq and applies the fixes of
:mod:`fairseq_sret.fairseq_patches`. Converting models lives in
:mod:`fairseq_sret.conversion`."""

from ..extras import require

require("fairseq", "the fairseq plugin (--user-dir fairseq_sret)")

from ..fairseq_patches import apply_patches  # noqa: E402

apply_patches()

from . import sret_transformer  # noqa: E402,F401  (registers the model and its architectures)

# fairseq's --user-dir loader imports only the tasks/ and models/ folders of a plugin, so the
# criteria register from here
from .. import criterions  # noqa: E402,F401
