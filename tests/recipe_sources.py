"""Source folders shaped like the official IWSLT'14 and WMT'14 downloads, built from the
real samples in ``../shared/data`` (the full training sets are not available offline), for
the preparation tests and the recipes' end-to-end runs."""

import itertools
import re
import shutil
from pathlib import Path

from fairseq_sret_cli.data import iwslt14
from fairseq_sret_cli.data.io import read_lines, write_lines
from fairseq_sret_cli.data.text import _moses_tokenizer, clean_indices, map_lines, moses_detokenize, moses_tokenize

WMT14_CORPORA = ["training/europarl-v7.de-en", "commoncrawl.de-en", "training/news-commentary-v9.de-en"]


def recase(line: str, lang: str) -> str:
    """Undo the lowercasing where it matters to the tokenizer: a capital after ". ", "? ", "! "
    (tokenizer.perl keeps "word." together when the next word starts lowercase)."""
    prefixes = {p.lower() for p in _moses_tokenizer(lang).NONBREAKING_PREFIXES}

    def cap(m):
        word = re.sub(r"^\W+", "", m.group(1))
        if word.lower() in prefixes or len(word) <= 1:
            return m.group(0)
        return m.group(1) + m.group(2) + m.group(3).upper()

    return re.sub(r"(\S+)([.!?]\s+)(\w)", cap, line)


def fake_valid_source(shared: Path, lang: str, n=None):
    """Cased-looking raw text for the valid lines (detokenized, lowercased reference + recasing)."""
    lines = read_lines(shared / "data/iwslt14/detok_lc" / f"valid.{lang}")[:n]
    return [recase(x, lang) for x in lines]


def iwslt14_source(shared: Path, folder: Path, n_valid: int) -> Path:
    """A ``de-en`` folder as in ``de-en.tgz``: the real dev/test XML files, and a
    ``train.tags.de-en.*`` whose every 23rd (content) line is one of the first ``n_valid``
    real valid pairs, the other lines pairs of the 4,600-pair training sample."""
    data = shared / "data/iwslt14"
    folder.mkdir(parents=True)
    for xml in (data / "raw_xml").glob("IWSLT14.*.xml"):
        shutil.copy(xml, folder / xml.name)
    filler = {
        lang: [recase(moses_detokenize(x.replace("@@ ", ""), lang), lang)
               for x in read_lines(data / "train_sample_4600_bpe10k" / f"train.{lang}")]
        for lang in ("de", "en")
    }
    # Only filler pairs that survive the cleaning keep the valid pairs at every 23rd position.
    keep = clean_indices(*(map_lines(moses_tokenize, filler[lang], lang=lang) for lang in ("de", "en")),
                         ratio=1.5, min_len=1, max_len=175)[0]
    filler = {lang: [filler[lang][i] for i in keep] for lang in filler}
    for lang in ("de", "en"):
        header = [f"<url>http://www.ted.com/talks/lang/{lang}/x.html</url>", "<keywords>talks, x</keywords>",
                  "<talkid>1</talkid>"]
        content = []
        it = itertools.cycle(filler[lang])
        for v in fake_valid_source(shared, lang, n_valid):
            content += [next(it) for _ in range(iwslt14.VALID_EVERY - 1)] + [v]
        content[0] = f"<title>{content[0]}</title>"
        content[1] = f"<description>{content[1]}</description>"
        write_lines(folder / f"train.tags.de-en.{lang}", header + content)
    return folder


def wmt14_source(shared: Path, folder: Path, n_train: int, n_dev=None) -> Path:
    """A folder as the WMT'14 archives unpack: the first ``n_train`` pairs of the 10,000-pair
    OpenNMT sample split into the three training corpora (detokenized back to raw text),
    the real newstest2014 SGML files and the first ``n_dev`` lines of newstest2013 (plain)."""
    data = shared / "data/wmt14"
    toy = {"en": read_lines(data / "toy_train_opennmt/src-train.txt")[:n_train],
           "de": read_lines(data / "toy_train_opennmt/tgt-train.txt")[:n_train]}
    size = n_train // len(WMT14_CORPORA)
    for i, corpus in enumerate(WMT14_CORPORA):
        for lang in ("en", "de"):
            write_lines(folder / f"{corpus}.{lang}",
                        [moses_detokenize(x, lang) for x in toy[lang][i * size:(i + 1) * size]])
    (folder / "test-full").mkdir()
    for name in ("newstest2014-deen-src.en.sgm", "newstest2014-deen-ref.de.sgm"):
        shutil.copy(data / "sgm" / name, folder / "test-full" / name)
    (folder / "dev").mkdir()
    for lang in ("en", "de"):  # plain-text dev set, as in dev.tgz
        write_lines(folder / "dev" / f"newstest2013.{lang}", read_lines(data / "plain" / f"newstest2013.{lang}")[:n_dev])
    return folder
