import numpy as np
import pytest

import fairseq_sret  # noqa: F401  (applies the fix)
from fairseq.data import data_utils


@pytest.mark.parametrize("n", [1, 7, 60, 6750])
@pytest.mark.parametrize("max_tokens,max_sentences", [(None, 32), (4096, None), (300, 16)])
def test_batch_by_size_keeps_every_example(n, max_tokens, max_sentences):
    sizes = np.sort(np.random.default_rng(n).integers(3, 40, n))
    batches = data_utils.batch_by_size(
        np.arange(n), num_tokens_fn=lambda i: sizes[i], num_tokens_vec=sizes,
        max_tokens=max_tokens, max_sentences=max_sentences, required_batch_size_multiple=8,
    )
    flat = np.concatenate([np.asarray(b) for b in batches])
    assert sorted(flat.tolist()) == list(range(n))
