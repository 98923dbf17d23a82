"""The ``diverse_beam_search`` patch: ``DiverseBeamSearch`` as ``build_generator`` makes it
returns ``--beam`` candidates per step where ``SequenceGenerator`` reads ``2 x --beam``, and
it indexes its per-sentence overlap counts by the sentences' dataset ids (the generator's
``original_batch_idxs``) although it made one row per sentence of the batch: with
``--diverse-beam-groups`` fairseq-generate fails with an ``IndexError`` for every model.
Patched: ``candidate_multiple=2`` (its own setting for this generator), and the ids are mapped
to the rows of the batch's first step.
"""

import torch


def diverse_beam_search_fails(search_cls=None) -> bool:
    """Does ``DiverseBeamSearch``, built as ``FairseqTask.build_generator`` builds it, return
    fewer than the ``2 x beam`` candidates per step that ``SequenceGenerator`` reads, or fail
    at the second step of a sentence whose dataset id is not below the batch size?"""
    from fairseq import search
    from fairseq.data import Dictionary

    search_cls = search_cls or search.DiverseBeamSearch
    dictionary = Dictionary()
    for i in range(8):
        dictionary.add_symbol(f"w{i}")
    beam = 4
    strategy = search_cls(dictionary, 2, 0.5)
    ids = torch.tensor([5])  # one sentence, the sixth of its data set
    lprobs = torch.log_softmax(torch.randn(1, beam, len(dictionary)), dim=-1)
    try:
        scores, _, _ = strategy.step(0, lprobs, None, None, ids)
        strategy.step(1, lprobs, torch.zeros(1, beam, 1), None, ids)
    except IndexError:
        return True
    return scores.size(1) < 2 * beam


def install(patch) -> None:
    from fairseq import search

    class DiverseBeamSearch(search.DiverseBeamSearch):
        """fairseq's diverse beam search with ``2 x beam`` candidates per step, whose overlap
        counts are kept per row of the batch (the generator gives the sentences' dataset ids)."""

        sret_patch = "diverse_beam_search"

        def __init__(self, tgt_dict, num_groups, diversity_strength, diversity_discount=1.0, candidate_multiple=2):
            super().__init__(tgt_dict, num_groups, diversity_strength, diversity_discount, candidate_multiple)

        def step(self, step, lprobs, scores, prev_output_tokens=None, original_batch_idxs=None):
            if original_batch_idxs is not None:
                if step == 0:
                    self.first_ids = original_batch_idxs.clone()
                # each sentence's row at the first step, where its overlap counts were made
                original_batch_idxs = (original_batch_idxs[:, None] == self.first_ids[None, :]).int().argmax(dim=1)
            return super().step(step, lprobs, scores, prev_output_tokens, original_batch_idxs)

    patch.replace(search, "DiverseBeamSearch", DiverseBeamSearch)
