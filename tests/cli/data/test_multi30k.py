"""Multi30k preparation on ../shared/data/multi30k/raw (training set cut to 3,000 pairs
for speed; the valid and test sets are complete)."""

import gzip

import pytest

pytest.importorskip("fairseq")  # sret-prepare binarises with fairseq

from fairseq_sret_cli.data import multi30k
from fairseq_sret_cli.data.io import read_lines, write_lines
from conftest import shared_path

N_TRAIN = 3000


@pytest.fixture(scope="module")
def m30k_dir(tmp_path_factory):
    raw = shared_path("data/multi30k/raw")
    root = tmp_path_factory.mktemp("m30k")
    src = root / "raw"
    for lang in ("de", "en"):
        write_lines(src / f"train.{lang}", read_lines(raw / f"train.{lang}")[:N_TRAIN])
        # the official files are gzipped: accept those too
        for name in ("val", "test_2016_flickr", "test_2017_flickr"):
            with gzip.open(src / f"{name}.{lang}.gz", "wb") as f:
                f.write((raw / f"{name}.{lang}").read_bytes())
    out = root / "bin"
    multi30k.prepare(out, src=src, vocab_size=1000)
    return out


def test_splits_and_references(m30k_dir, shared_dir):
    raw = shared_dir / "data/multi30k/raw"
    for split, name, n in (("valid", "val", 1014), ("test", "test_2016_flickr", 1000), ("test1", "test_2017_flickr", 1000)):
        for lang in ("de", "en"):
            assert read_lines(m30k_dir / "text" / f"{split}.raw.{lang}") == read_lines(raw / f"{name}.{lang}")
            assert len(read_lines(m30k_dir / "text" / f"{split}.sp.{lang}")) == n
            assert (m30k_dir / f"{split}.de-en.{lang}.bin").stat().st_size > 0
    assert len(read_lines(m30k_dir / "text/train.sp.de")) == N_TRAIN


def test_joined_dictionary_and_metadata(m30k_dir):
    from fairseq_sret_cli.data.common import read_metadata

    assert (m30k_dir / "dict.de.txt").read_text() == (m30k_dir / "dict.en.txt").read_text()
    meta = read_metadata(m30k_dir)
    assert meta["recipe"] == "multi30k" and meta["subsets"]["test"]["name"] == "test_2016_flickr"
    assert (m30k_dir / meta["spm_model"]).is_file()


def test_pieces_decode_to_raw_text(m30k_dir):
    from fairseq_sret_cli.data.subword import SentencePieceCodec

    pieces = read_lines(m30k_dir / "text/test.sp.en")
    raw = read_lines(m30k_dir / "text/test.raw.en")
    assert [SentencePieceCodec.decode(p) for p in pieces] == [" ".join(x.split()) for x in raw]


def test_download_fails_clearly_offline(tmp_path, monkeypatch):
    import urllib.request

    from fairseq_sret_cli.data.download import DownloadError

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(DownloadError, match="--src"):
        multi30k.prepare(tmp_path / "bin")
