"""IWSLT'14 German-English, following fairseq's ``examples/translation/prepare-iwslt14.sh``.

* train: ``train.tags.de-en.{de,en}`` without the url/talkid/keywords lines and the
  title/description tags, Moses-tokenized, cleaned (``clean-corpus-n.perl -ratio 1.5``,
  1-175 words), lowercased;
* valid: every 23rd line of that (removed from train);
* test: dev2010 + TEDX.dev2012 + tst2010 + tst2011 + tst2012 (XML ``<seg>`` text, ``’``
  -> ``'``, Moses-tokenized, lowercased).

fairseq's script then learns 10,000 joint subword-nmt BPE merges; we learn a joint
SentencePiece BPE vocabulary of 10,000 pieces on the same tokenized, lowercased text
(subword-nmt is not a dependency). The evaluation protocol is unchanged: the model
output, with subwords removed, is Moses-tokenized lowercased text, scored against the
tokenized references (``text/test.en``) -- the tokenized BLEU of the IWSLT literature.
"""

from pathlib import Path
from typing import Dict, Optional

from .common import Sources, build_data_bin, write_metadata
from .io import log, read_lines, write_lines
from .text import clean_parallel, iwslt_train_filter, map_lines, moses_tokenize, tokenize_lowercase, xml_segments

URLS = [
    "https://wit3.fbk.eu/archive/2014-01/texts/de/en/de-en.tgz",  # prepare-iwslt14.sh, originally
    "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz",  # fairseq's mirror (the script's current URL)
]
TEST_PARTS = ["TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012"]
VALID_EVERY = 23


def preprocess_train(lines, lang: str, workers: int = 1):
    """Meta-data filter + Moses tokenization (cased; lowercasing comes after cleaning)."""
    return map_lines(moses_tokenize, iwslt_train_filter(lines), workers, what=f"tokenizing train.{lang}", lang=lang)


def preprocess_test(path, lang: str, workers: int = 1):
    """(untouched segment text, tokenized+lowercased text) of one dev/test XML file."""
    return xml_segments(path, normalize_quote=False), map_lines(tokenize_lowercase, xml_segments(path), workers, lang=lang)


def prepare(
    out_dir,
    src: Optional[str] = None,
    src_lang: str = "de",
    tgt_lang: str = "en",
    vocab_size: int = 10000,
    workers: int = 1,
    work_dir=None,
) -> Path:
    """Build the IWSLT'14 data-bin in ``out_dir`` from ``src`` (de-en.tgz, the folder it
    extracts to, or None to download it)."""
    if {src_lang, tgt_lang} != {"de", "en"}:
        raise ValueError("IWSLT'14 here is German-English (either direction)")
    out_dir = Path(out_dir)
    sources = Sources(src, work_dir or out_dir / "orig", {"de-en.tgz": URLS})
    pair = "de-en"

    tok = {}
    for lang in ("de", "en"):
        path = sources.find(f"train.tags.{pair}.{lang}")
        log(f"reading {path}")
        tok[lang] = preprocess_train(read_lines(path), lang, workers)
    log(f"cleaning {len(tok['de']):,} pairs (ratio 1.5, 1-175 words)")
    clean_de, clean_en = clean_parallel(tok["de"], tok["en"], ratio=1.5, min_len=1, max_len=175)
    log(f"kept {len(clean_de):,} pairs")
    clean = {"de": [x.lower() for x in clean_de], "en": [x.lower() for x in clean_en]}

    texts: Dict[str, Dict[str, list]] = {"train": {}, "valid": {}, "test": {}}
    raw_test = {}
    for lang in ("de", "en"):
        lines = clean[lang]
        texts["valid"][lang] = [x for i, x in enumerate(lines, 1) if i % VALID_EVERY == 0]
        texts["train"][lang] = [x for i, x in enumerate(lines, 1) if i % VALID_EVERY != 0]
        raw_test[lang], texts["test"][lang] = [], []
        for part in TEST_PARTS:
            raw, tokenized = preprocess_test(sources.find(f"IWSLT14.{part}.{pair}.{lang}.xml"), lang, workers)
            write_lines(out_dir / "text" / "testsets" / f"IWSLT14.{part}.{pair}.{lang}", tokenized)
            raw_test[lang] += raw
            texts["test"][lang] += tokenized
        write_lines(out_dir / "text" / f"test.raw.{lang}", raw_test[lang])
    for split in texts:
        log(f"{split}: {len(texts[split]['de']):,} pairs")

    build_data_bin(out_dir, src_lang, tgt_lang, texts, vocab_size, workers=workers)
    write_metadata(out_dir, {
        "recipe": "iwslt14",
        "source_lang": src_lang,
        "target_lang": tgt_lang,
        "spm_model": "spm.model",
        "output": "tokenized_lowercased",
        "scores": ["tokenized_bleu", "sacrebleu_lc"],
        "subsets": {
            "test": {
                "name": "IWSLT14 test (dev2010+TEDX.dev2012+tst2010+tst2011+tst2012)",
                "source": f"text/test.raw.{src_lang}",
                "reference": f"text/test.raw.{tgt_lang}",
                "reference_tokenized": f"text/test.{tgt_lang}",
            },
            "valid": {
                "name": "IWSLT14 valid (every 23rd training pair)",
                "reference_tokenized": f"text/valid.{tgt_lang}",
            },
        },
        "options": {"vocab_size": vocab_size, "subword": "sentencepiece-bpe", "valid_every": VALID_EVERY,
                    "clean_ratio": 1.5, "clean_length": [1, 175]},
    })
    return out_dir
