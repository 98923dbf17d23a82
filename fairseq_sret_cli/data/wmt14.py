"""WMT'14 English-German with a joint SentencePiece vocabulary.

Corpora as in fairseq's ``prepare-wmt14en2de.sh`` (``--icml17``, the WMT'14 data):
Europarl v7, Common Crawl and News Commentary v9 for training; newstest2013 for
validation (as in the Transformer papers); newstest2014 (the "full" 3,003-sentence
version from test-full.tgz) for testing.

Training text: ``normalize-punctuation.perl`` + ``remove-non-printing-char.perl``
(Python ports), no Moses tokenization: SentencePiece (32K joint BPE by default) works on
raw text, so the model's output is detokenized text for sacreBLEU. The training pairs are
then cleaned like the script does after BPE (``clean-corpus-n.perl -ratio 1.5``,
1-250 pieces). Test/valid sources get the same normalization before encoding; the
references stay untouched. The compound-split BLEU of the literature is computed at
evaluation time (Moses-tokenized output and references, ``##AT##-##AT##``).
"""

from pathlib import Path
from typing import Dict, Optional

from .common import Sources, build_data_bin, read_parallel, write_metadata
from .io import log, read_lines, write_lines
from .text import clean_indices, map_lines, sgm_segments, wmt_normalize

CORPORA = ["europarl-v7.de-en", "commoncrawl.de-en", "news-commentary-v9.de-en"]
DOWNLOADS = {
    "training-parallel-europarl-v7.tgz": ["http://statmt.org/wmt13/training-parallel-europarl-v7.tgz"],
    "training-parallel-commoncrawl.tgz": ["http://statmt.org/wmt13/training-parallel-commoncrawl.tgz"],
    "training-parallel-nc-v9.tgz": ["http://statmt.org/wmt14/training-parallel-nc-v9.tgz"],
    "dev.tgz": ["http://data.statmt.org/wmt17/translation-task/dev.tgz"],
    "test-full.tgz": ["http://statmt.org/wmt14/test-full.tgz"],
}


def read_newstest(sources: Sources, name: str, src_lang: str, tgt_lang: str, pair: str = ""):
    """(source, reference) segments of a newstest set: SGML ``NAME-src.L.sgm`` /
    ``NAME-ref.L.sgm`` (``NAME-PAIR-...`` for test-full), else plain ``NAME.L``."""
    stem = f"{name}-{pair}" if pair else name
    src_sgm = sources.find(f"{stem}-src.{src_lang}.sgm", required=False)
    ref_sgm = sources.find(f"{stem}-ref.{tgt_lang}.sgm", required=False)
    if src_sgm and ref_sgm:
        src, ref = sgm_segments(src_sgm), sgm_segments(ref_sgm)
    else:
        src = read_lines(sources.find(f"{name}.{src_lang}"))
        ref = read_lines(sources.find(f"{name}.{tgt_lang}"))
    if len(src) != len(ref):
        raise ValueError(f"{name}: {len(src)} source but {len(ref)} reference segments")
    log(f"{name}: {len(src):,} segments")
    return src, ref


def prepare(
    out_dir,
    src: Optional[str] = None,
    src_lang: str = "en",
    tgt_lang: str = "de",
    vocab_size: int = 32000,
    workers: int = 1,
    work_dir=None,
    input_sentence_size: int = 4_000_000,
    max_len: int = 250,
) -> Path:
    """Build the WMT'14 data-bin in ``out_dir`` from ``src`` (a folder holding the corpora,
    dev and test files or their archives; None downloads them from statmt.org)."""
    if {src_lang, tgt_lang} != {"de", "en"}:
        raise ValueError("WMT'14 here is English-German (either direction)")
    out_dir = Path(out_dir)
    sources = Sources(src, work_dir or out_dir / "orig", DOWNLOADS)

    train = {src_lang: [], tgt_lang: []}
    for corpus in CORPORA:
        s, t = read_parallel(sources, [f"{corpus}.{src_lang}"], [f"{corpus}.{tgt_lang}"], corpus)
        train[src_lang] += s
        train[tgt_lang] += t
    texts: Dict[str, Dict[str, list]] = {"train": {}, "valid": {}, "test": {}}
    for lang in (src_lang, tgt_lang):
        texts["train"][lang] = map_lines(wmt_normalize, train[lang], workers, what=f"normalizing train.{lang}", lang=lang)
    del train

    refs = {}
    for split, name, pair in (("valid", "newstest2013", ""), ("test", "newstest2014", "deen")):
        source, reference = read_newstest(sources, name, src_lang, tgt_lang, pair)
        write_lines(out_dir / "text" / f"{split}.raw.{src_lang}", source)
        write_lines(out_dir / "text" / f"{split}.raw.{tgt_lang}", reference)
        refs[split] = reference
        texts[split][src_lang] = [wmt_normalize(x, src_lang) for x in source]
        # The target side of valid/test only feeds the validation loss: normalize it alike.
        texts[split][tgt_lang] = [wmt_normalize(x, tgt_lang) for x in reference]

    def clean(src_pieces, tgt_pieces):
        # clean-corpus-n.perl on the subword text, as prepare-wmt14en2de.sh does after BPE.
        return clean_indices(src_pieces, tgt_pieces, ratio=1.5, min_len=1, max_len=max_len)[0]

    build_data_bin(
        out_dir, src_lang, tgt_lang, texts, vocab_size, workers=workers,
        input_sentence_size=input_sentence_size, clean_encoded=clean,
    )
    write_metadata(out_dir, {
        "recipe": "wmt14",
        "source_lang": src_lang,
        "target_lang": tgt_lang,
        "spm_model": "spm.model",
        "output": "detokenized",
        "scores": ["sacrebleu", "compound_split_bleu"],
        "subsets": {
            "test": {"name": "newstest2014 (full, 3003 segments)", "source": f"text/test.raw.{src_lang}",
                     "reference": f"text/test.raw.{tgt_lang}"},
            "valid": {"name": "newstest2013", "source": f"text/valid.raw.{src_lang}",
                      "reference": f"text/valid.raw.{tgt_lang}"},
        },
        "options": {"vocab_size": vocab_size, "subword": "sentencepiece-bpe", "corpora": CORPORA,
                    "clean_ratio": 1.5, "clean_length": [1, max_len]},
    })
    return out_dir
