"""WMT'14 En-De preparation end to end on ../shared/data/wmt14: the 10,000-pair OpenNMT toy
training sample (split into the three WMT'14 corpora, detokenized back to raw text) and
the real newstest2013 / newstest2014 files."""

import pytest

from fairseq_sret_cli.data import wmt14
from fairseq_sret_cli.data.io import read_lines
from fairseq_sret_cli.data.text import sgm_segments
from conftest import shared_path
from recipe_sources import wmt14_source

pytestmark = pytest.mark.slow

N_TRAIN = 3000


@pytest.fixture(scope="module")
def wmt_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("wmt")
    orig = wmt14_source(shared_path(), root / "wmt14", N_TRAIN)
    out = root / "bin"
    wmt14.prepare(out, src=orig, vocab_size=1000, input_sentence_size=0)
    return out


def test_test_and_valid_sets(wmt_dir, shared_dir):
    plain = shared_dir / "data/wmt14/plain"
    assert read_lines(wmt_dir / "text/test.raw.en") == read_lines(plain / "newstest2014.en")
    assert read_lines(wmt_dir / "text/test.raw.de") == read_lines(plain / "newstest2014.de")
    assert len(read_lines(wmt_dir / "text/test.raw.de")) == 3003
    assert read_lines(wmt_dir / "text/valid.raw.de") == read_lines(plain / "newstest2013.de")
    assert len(read_lines(wmt_dir / "text/valid.sp.en")) == 3000
    assert len(read_lines(wmt_dir / "text/test.sp.en")) == 3003


def test_sgm_extraction_matches_plain(shared_dir):
    data = shared_dir / "data/wmt14"
    assert sgm_segments(data / "sgm/newstest2013-src.en.sgm") == read_lines(data / "plain/newstest2013.en")
    assert sgm_segments(data / "sgm/newstest2014-deen-ref.de.sgm") == read_lines(data / "plain/newstest2014.de")


def test_training_data_cleaned(wmt_dir):
    src = read_lines(wmt_dir / "text/train.sp.en")
    tgt = read_lines(wmt_dir / "text/train.sp.de")
    assert len(src) == len(tgt) == len(read_lines(wmt_dir / "text/train.en"))
    assert 0.8 * N_TRAIN < len(src) < N_TRAIN  # the empty source line and bad length ratios are gone
    for s, t in zip(src, tgt):
        ns, nt = len(s.split()), len(t.split())
        assert 1 <= ns <= 250 and 1 <= nt <= 250 and ns / nt <= 1.5 and nt / ns <= 1.5


def test_data_bin(wmt_dir):
    from fairseq_sret_cli.data.common import read_metadata
    from fairseq_sret_cli.data.subword import SentencePieceCodec

    meta = read_metadata(wmt_dir)
    assert (meta["source_lang"], meta["target_lang"]) == ("en", "de")
    assert meta["scores"] == ["sacrebleu", "compound_split_bleu"]
    assert (wmt_dir / "dict.en.txt").read_text() == (wmt_dir / "dict.de.txt").read_text()
    for split in ("train", "valid", "test"):
        assert (wmt_dir / f"{split}.en-de.de.idx").is_file()
    # identity normalization: pieces decode to the (punctuation-normalized) text
    pieces = read_lines(wmt_dir / "text/test.sp.de")[:100]
    assert [SentencePieceCodec.decode(p) for p in pieces] == [" ".join(x.split()) for x in read_lines(wmt_dir / "text/test.de")[:100]]
