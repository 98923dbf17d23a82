"""IWSLT'14 De-En preparation against fairseq's prepare-iwslt14.sh output (../shared/data/iwslt14).

The full training set is not available offline, so the end-to-end run uses a fake
``de-en`` folder: the real dev/test XML files, and a ``train.tags.de-en.*`` whose every
23rd (content) line is a real valid pair and whose other lines are pairs of the 4,600-pair
training sample. Our valid/test text must equal the reference ``tok/`` files on >= 99.5%
of the lines.
"""

import pytest

from fairseq_sret_cli.data import iwslt14
from fairseq_sret_cli.data.io import read_lines
from fairseq_sret_cli.data.text import tokenize_lowercase
from conftest import SHARED, shared_path
from recipe_sources import fake_valid_source, iwslt14_source

pytestmark = pytest.mark.slow

N_VALID = 400  # valid pairs placed in the fake training file (x23 lines per side)


def match_rate(ours, ref):
    assert len(ours) == len(ref)
    return sum(a == b for a, b in zip(ours, ref)) / len(ref)


@pytest.fixture(scope="module")
def iwslt_dir(tmp_path_factory):
    shared_path("data/iwslt14")
    root = tmp_path_factory.mktemp("iwslt")
    orig = iwslt14_source(SHARED, root / "de-en", N_VALID)
    out = root / "bin"
    iwslt14.prepare(out, src=orig, vocab_size=2000)
    return out


def test_test_set_matches_reference_tok(iwslt_dir, shared_dir):
    ref = shared_dir / "data/iwslt14/tok"
    for lang in ("de", "en"):
        ours = read_lines(iwslt_dir / "text" / f"test.{lang}")
        rate = match_rate(ours, read_lines(ref / f"test.{lang}"))
        print(f"test.{lang}: {rate:.4%} of {len(ours)} lines equal tok/test.{lang}")
        assert rate >= 0.995
        for part in iwslt14.TEST_PARTS:
            name = f"IWSLT14.{part}.de-en.{lang}"
            assert match_rate(read_lines(iwslt_dir / "text/testsets" / name), read_lines(ref / "testsets" / name)) >= 0.995
    # raw (cased, untokenized) references for sacreBLEU, in the same order
    assert read_lines(iwslt_dir / "text/test.raw.en") == read_lines(shared_dir / "data/iwslt14/raw_plain/test.en")


def test_valid_is_every_23rd_pair_and_matches_reference_tok(iwslt_dir, shared_dir):
    for lang in ("de", "en"):
        ours = read_lines(iwslt_dir / "text" / f"valid.{lang}")
        ref = read_lines(shared_dir / "data/iwslt14/tok" / f"valid.{lang}")[:N_VALID]
        rate = match_rate(ours, ref)
        print(f"valid.{lang} (end to end, {N_VALID} lines): {rate:.4%}")
        assert rate >= 0.995
    train_en = read_lines(iwslt_dir / "text/train.en")
    assert len(train_en) == N_VALID * (iwslt14.VALID_EVERY - 1)
    assert not any("<title>" in x or "<url>" in x or "<talkid>" in x for x in train_en)
    assert all(x == x.lower() for x in train_en[:200])


def test_full_valid_tokenization_matches_reference(shared_dir):
    """All 7,283 valid lines through the same tokenizer + lowercasing."""
    for lang in ("de", "en"):
        ours = [tokenize_lowercase(x, lang) for x in fake_valid_source(shared_dir, lang)]
        rate = match_rate(ours, read_lines(shared_dir / "data/iwslt14/tok" / f"valid.{lang}"))
        print(f"valid.{lang} (all lines): {rate:.4%}")
        assert rate >= 0.995


def test_data_bin_and_metadata(iwslt_dir):
    from fairseq_sret_cli.data.common import read_metadata

    meta = read_metadata(iwslt_dir)
    assert meta["recipe"] == "iwslt14" and meta["output"] == "tokenized_lowercased"
    assert (iwslt_dir / "dict.de.txt").read_text() == (iwslt_dir / "dict.en.txt").read_text()  # joined
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            assert (iwslt_dir / f"{split}.de-en.{lang}.bin").stat().st_size > 0
    assert len(read_lines(iwslt_dir / "text/test.sp.en")) == 6750
    # the subword text decodes back to the tokenized text
    from fairseq_sret_cli.data.subword import SentencePieceCodec

    pieces = read_lines(iwslt_dir / "text/test.sp.en")[:50]
    assert [SentencePieceCodec.decode(p) for p in pieces] == read_lines(iwslt_dir / "text/test.en")[:50]
