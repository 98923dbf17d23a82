"""Unit tests of the Python ports of the Moses / fairseq preparation scripts."""

import pytest

from fairseq_sret_cli.data.io import read_lines, write_lines
from fairseq_sret_cli.data.text import (
    clean_indices, clean_parallel, compound_split, iwslt_train_filter, moses_detokenize, moses_tokenize,
    remove_non_printing, sgm_segments, tokenize_lowercase, xml_segments,
)


def test_tokenizer_splits_the_last_period_like_tokenizer_perl():
    pytest.importorskip("sacremoses")  # the 'fairseq' extra
    # sacremoses alone keeps "u.s.a." / "75." together at the end of a line; tokenizer.perl does not
    assert moses_tokenize("Aber dies sind alle Straßen in den U.S.A.", "de") == "Aber dies sind alle Straßen in den U.S.A ."
    assert moses_tokenize("wie in den vorhergegangenen 75.", "de") == "wie in den vorhergegangenen 75 ."
    assert moses_tokenize("Mr. Smith said \"it's fine\".", "en") == "Mr. Smith said &quot; it &apos;s fine &quot; ."
    assert tokenize_lowercase("Hello World!", "en") == "hello world !"
    assert moses_detokenize("it &apos;s a &quot; test &quot; .", "en") == 'it\'s a "test".'


def test_aggressive_dash_split():
    pytest.importorskip("sacremoses")  # the 'fairseq' extra
    assert moses_tokenize("a well-known fact", "en", aggressive_dash_splits=True) == "a well @-@ known fact"
    assert moses_tokenize("a well-known fact", "en") == "a well-known fact"


def test_clean_corpus_rules():
    src = ["a b c", "", "a  b\tc ", "x", "one two three four", "w " * 6, "a|b c"]
    tgt = ["a b c", "x", "a b c", "y z", "one", "w", "d e"]
    keep, s, t = clean_indices(src, tgt, ratio=1.5, min_len=1, max_len=5)
    # empty side; 1 vs 2 words (ratio 2); 4 vs 1; 6 words > max -> dropped
    assert keep == [0, 2, 6]
    assert s == ["a b c", "a b c", "ab c"]  # whitespace collapsed, "|" removed (first line not factored)
    assert t == ["a b c", "a b c", "d e"]
    assert clean_parallel(["a " * 3], ["b " * 4], ratio=1.5) == (["a a a"], ["b b b b"])
    assert clean_parallel(["a"], ["b " * 2], ratio=1.5) == ([], [])
    with pytest.raises(ValueError):
        clean_parallel(["a"], [])


def test_clean_drops_overlong_words():
    assert clean_parallel(["x" * 1001], ["y"], max_word_length=1000) == ([], [])
    assert clean_parallel(["x" * 1000], ["y"], max_word_length=1000, ratio=9) == (["x" * 1000], ["y"])


def test_iwslt_train_filter():
    lines = ["<url>http://x</url>", "<keywords>k</keywords>", "<speaker>S</speaker>", "<talkid>1</talkid>",
             "<title>T: a talk</title>", "<description>D</description>", "Hello."]
    assert iwslt_train_filter(lines) == ["<speaker>S</speaker>", "T: a talk", "D", "Hello."]


def test_xml_and_sgm_segments(tmp_path):
    xml = tmp_path / "x.xml"
    write_lines(xml, ['<doc docid="1">', '<seg id="1"> It’s here. </seg>', "<title>no</title>",
                      '<seg id="2">Two  spaces</seg>  ', "</doc>"])
    assert xml_segments(xml) == ["It's here.", "Two  spaces"]
    assert xml_segments(xml, normalize_quote=False) == ["It’s here.", "Two  spaces"]
    sgm = tmp_path / "x.sgm"
    write_lines(sgm, ['<doc docid="1">', '<seg id="1"> A  &amp; B </seg>', "</doc>"])
    assert sgm_segments(sgm) == ["A &amp; B"]


def test_compound_split_and_non_printing():
    assert compound_split("Das Hotel-Zimmer ist gut-") == "Das Hotel ##AT##-##AT## Zimmer ist gut-"
    assert compound_split("a-b-c") == "a ##AT##-##AT## b-c"  # perl /g: non-overlapping, like fairseq's script
    assert remove_non_printing("a\u200bb\tc") == "a b c"
    assert remove_non_printing("plain text") == "plain text"


def test_read_lines_keeps_carriage_returns_inside_lines(tmp_path):
    p = tmp_path / "f.txt"
    p.write_bytes("a\rb\nc\u2028d\n".encode())
    assert read_lines(p) == ["a\rb", "c\u2028d"]  # only "\n" ends a line, as in perl


@pytest.mark.reliability("inputs-as-they-seem")
def test_read_lines_drops_windows_line_ends_and_a_byte_order_mark(tmp_path):
    p = tmp_path / "windows.txt"
    p.write_bytes("\ufeffEin Hund .\r\nZwei\rKatzen .\r\nlast".encode())
    assert read_lines(p) == ["Ein Hund .", "Zwei\rKatzen .", "last"]
    gz = tmp_path / "windows.txt.gz"
    import gzip

    gz.write_bytes(gzip.compress(p.read_bytes()))
    assert read_lines(gz) == read_lines(p)


def test_sources_accept_an_archive_or_a_folder_with_archives(tmp_path):
    import tarfile

    from fairseq_sret_cli.data.common import Sources

    src = tmp_path / "de-en"
    write_lines(src / "train.tags.de-en.de", ["Hallo ."])
    archive = tmp_path / "dl" / "de-en.tgz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname="de-en")
    found = Sources(archive, tmp_path / "work1", {}).find("train.tags.de-en.de")
    assert read_lines(found) == ["Hallo ."] and "work1" in str(found)
    found = Sources(archive.parent, tmp_path / "work2", {}).find("train.tags.de-en.de")
    assert read_lines(found) == ["Hallo ."]
    assert Sources(src, tmp_path / "work3", {}).find("missing", required=False) is None
    with pytest.raises(FileNotFoundError, match="official files"):
        Sources(src, tmp_path / "work3", {}).find("missing")


@pytest.mark.reliability("tied-to-inputs")
def test_a_replaced_archive_is_extracted_again(tmp_path):
    """An archive unpacked once is not unpacked again, until another file takes its name: then
    its files replace the stale ones (sret-prepare --force after a new download)."""
    import io
    import os
    import tarfile

    from fairseq_sret_cli.data.download import extract

    def write_archive(text: str, mtime_ns: int):
        with tarfile.open(tmp_path / "corpus.tgz", "w:gz") as tar:
            data = text.encode()
            info = tarfile.TarInfo("train.de")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        os.utime(tmp_path / "corpus.tgz", ns=(mtime_ns, mtime_ns))

    write_archive("alt\n", 10**18)
    out = extract(tmp_path / "corpus.tgz", tmp_path / "extracted")
    assert (out / "train.de").read_text() == "alt\n"
    (out / "train.de").write_text("edited\n")  # the same archive again: nothing is unpacked
    assert (extract(tmp_path / "corpus.tgz", out) / "train.de").read_text() == "edited\n"
    write_archive("neu\n", 10**18 + 10**9)
    assert (extract(tmp_path / "corpus.tgz", out) / "train.de").read_text() == "neu\n"
