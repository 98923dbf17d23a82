"""The BLEU variants against sacreBLEU (and fairseq's own scorer) on fixed strings."""

import pytest

pytest.importorskip("sacrebleu")  # the 'fairseq' extra

import sacrebleu

from fairseq_sret_cli.evaluation import bleu

HYPS = ["the cat sat on the mat .", "there is a dog in the garden .", "he reads a well-known book"]
REFS = ["the cat sat on a mat .", "a dog is in the garden .", "he is reading a well-known book"]


def test_tokenized_bleu_is_sacrebleu_without_tokenization():
    ours = bleu.tokenized_bleu(HYPS, REFS)
    ref = sacrebleu.corpus_bleu(HYPS, [REFS], tokenize="none", force=True)
    assert ours.score == pytest.approx(ref.score)
    assert "tok:none" in ours.signature
    assert bleu.tokenized_bleu(REFS, REFS).score == pytest.approx(100.0)


def test_tokenized_bleu_matches_fairseq_score():
    """fairseq-score (fairseq's C BLEU scorer, what multi-bleu-style IWSLT numbers come from)."""
    pytest.importorskip("fairseq")
    from fairseq.data import Dictionary
    from fairseq.scoring import bleu as fairseq_bleu

    d = Dictionary()
    scorer = fairseq_bleu.Scorer(fairseq_bleu.BleuConfig(pad=d.pad(), eos=d.eos(), unk=d.unk()))
    for h, r in zip(HYPS, REFS):
        scorer.add(d.encode_line(r, add_if_not_exist=True).int(), d.encode_line(h, add_if_not_exist=True).int())
    assert bleu.tokenized_bleu(HYPS, REFS).score == pytest.approx(scorer.score(), abs=1e-4)


def test_sacrebleu_detok_and_signature():
    hyps = ["The cat sat on the mat.", "There is a dog in the garden."]
    refs = ["The cat sat on a mat.", "A dog is in the garden."]
    ours = bleu.sacrebleu_detok(hyps, refs)
    assert ours.score == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert "case:mixed" in ours.signature and "tok:13a" in ours.signature and "nrefs:1" in ours.signature
    lower = bleu.sacrebleu_detok([h.lower() for h in hyps], refs, lowercase=True)
    assert lower.score == pytest.approx(sacrebleu.corpus_bleu([h.lower() for h in hyps], [refs], lowercase=True).score)
    assert "case:lc" in lower.signature
    assert lower.score >= ours.score  # "A dog" now matches "a dog"
    assert lower.score > bleu.sacrebleu_detok([h.lower() for h in hyps], refs).score
    assert "BP" in ours.detail and "hyp_len" in ours.detail


def test_compound_split_bleu():
    hyps = ["Das ist ein Hotel-Zimmer ."]
    refs = ["Das ist ein Hotel-Bett ."]
    split = bleu.compound_split_bleu(hyps, refs, tokenize=False)
    expected = sacrebleu.corpus_bleu(["Das ist ein Hotel ##AT##-##AT## Zimmer ."],
                                     [["Das ist ein Hotel ##AT##-##AT## Bett ."]], tokenize="none", force=True)
    assert split.score == pytest.approx(expected.score)
    # splitting the compound credits the shared "Hotel -" n-grams
    assert split.score > bleu.tokenized_bleu(hyps, refs).score
    # detokenized input is Moses-tokenized first (the period splits off)
    assert bleu.compound_split_bleu(["Das ist ein Hotel-Zimmer."], refs).score == pytest.approx(split.score)


def test_tokenized_lowercased_bleu():
    assert bleu.tokenized_lowercased_bleu(["Hello, World!"], ["hello , world !"], lang="en").score == pytest.approx(100)
    hyps, refs = ["A man rides a bike."], ["A man is riding a bike."]
    expected = sacrebleu.corpus_bleu(["a man rides a bike ."], [["a man is riding a bike ."]], tokenize="none")
    assert bleu.tokenized_lowercased_bleu(hyps, refs, lang="en").score == pytest.approx(expected.score)


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError):
        bleu.tokenized_bleu(["a"], ["a", "b"])
