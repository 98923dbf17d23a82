"""fairseq adapters: importing this module registers the SReT architectures with fairseq."""

from . import fairseq_fixes  # noqa: F401  (keeps the batches fairseq would drop)
from . import checkpoint_loading  # noqa: F401  (allow-lists what our checkpoints contain)
from . import distributed  # noqa: F401  (fairseq's DDP wrapper on CPUs)
from . import sret_transformer  # noqa: F401
