"""fairseq criteria (``--criterion``). Registered when :mod:`fairseq_sret.models` is imported
(``--user-dir fairseq_sret`` does it)."""

from . import mixed_depth  # noqa: F401  (registers sret_mixed_depth_label_smoothed_cross_entropy)
