"""The former name of :mod:`fairseq_sret.checkpoints` (safe checkpoint reading, writing and
averaging, for translation and vision alike); importing it gives that module."""

import sys

from . import checkpoints

sys.modules[__name__] = checkpoints
