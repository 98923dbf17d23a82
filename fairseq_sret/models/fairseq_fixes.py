"""Work-arounds for bugs of the installed fairseq that change results silently.

``fairseq.data.data_utils.batch_by_size`` in fairseq's main branch (the
``fairseq-fixed`` 0.12.3.1 package) drops the last batch whenever its size is not a
multiple of ``--required-batch-size-multiple`` (default 8). ``fairseq-generate`` then
skips up to a batch of test sentences without a word (e.g. 4 of 60, or 6 of IWSLT'14's
6,750), and BLEU is computed on a subset. With this plugin loaded the dropped examples
come back as a final batch, and a warning says so once. Passing
``--required-batch-size-multiple 1`` avoids the bug without the plugin.
"""

import functools
import logging

import numpy as np
from fairseq.data import data_utils

logger = logging.getLogger(__name__)


def _keep_last_batch(batch_by_size):
    if getattr(batch_by_size, "sret_keeps_last_batch", False):
        return batch_by_size

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
    wrapper.sret_keeps_last_batch = True
    return wrapper


data_utils.batch_by_size = _keep_last_batch(data_utils.batch_by_size)
