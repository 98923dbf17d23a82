"""The ``keep_last_batch`` patch: ``fairseq.data.data_utils.batch_by_size`` drops the last batch
whenever its size is not a multiple of ``--required-batch-size-multiple`` (default 8), so
``fairseq-generate`` silently skips up to a batch of test sentences and BLEU is computed on a
subset. Patched: the dropped examples come back as a final batch, with a warning once.
"""

import functools
import logging

import numpy as np
from fairseq.data import data_utils

logger = logging.getLogger(__name__)


def _keep_last_batch(batch_by_size):
    @functools.wraps(batch_by_size)
    def wrapper(indices, *args, **kwargs):
        batches = batch_by_size(indices, *args, **kwargs)
        indices = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices), dtype=np.int64)
        batched = np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if len(batches) else indices[:0]
        if len(batched) == len(indices):
            return batches
        dropped = indices[~np.isin(indices, batched)]
        if not wrapper.warned:
            logger.warning(
                "fairseq's batch_by_size dropped its last batch (%d of %d examples); fairseq_sret"
                " keeps it (or pass --required-batch-size-multiple 1)", len(dropped), len(indices),
            )
            wrapper.warned = True
        return list(batches) + [dropped]

    wrapper.warned = False
    wrapper.sret_patch = "keep_last_batch"
    return wrapper


def batch_by_size_drops_examples(batch_by_size=None) -> bool:
    """Does ``batch_by_size`` lose an example that does not fill a multiple-of-2 batch?"""
    batch_by_size = batch_by_size or data_utils.batch_by_size
    batches = batch_by_size(
        np.arange(3, dtype=np.int64), num_tokens_fn=lambda i: 1, max_sentences=2, required_batch_size_multiple=2
    )
    return sum(len(b) for b in batches) != 3


def install(patch) -> None:
    patch.replace(data_utils, "batch_by_size", _keep_last_batch(data_utils.batch_by_size))
