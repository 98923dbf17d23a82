"""Multi30k (task 1, German-English image captions), the quick-start corpus.

Raw (cased, untokenized) files of the multi30k/dataset repository -> joint SentencePiece
BPE (8K) -> data-bin. Splits: train (29,000), valid = ``val`` (1,014), test =
``test_2016_flickr`` (1,000) and, when present, test1 = ``test_2017_flickr`` (1,000).
"""

from pathlib import Path
from typing import Dict, Optional

from .common import Sources, build_data_bin, write_metadata
from .io import read_lines, write_lines
from .text import check_parallel

RAW_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{}.gz"
SPLITS = [("train", "train"), ("valid", "val"), ("test", "test_2016_flickr"), ("test1", "test_2017_flickr")]
LANGS = ("de", "en")


def downloads() -> Dict[str, list]:
    return {f"{name}.{lang}.gz": [RAW_URL.format(f"{name}.{lang}")] for _, name in SPLITS for lang in LANGS}


def prepare(
    out_dir,
    src: Optional[str] = None,
    src_lang: str = "de",
    tgt_lang: str = "en",
    vocab_size: int = 8000,
    workers: int = 1,
    work_dir=None,
) -> Path:
    """Build the Multi30k data-bin in ``out_dir`` from ``src`` (a folder with
    ``{train,val,test_2016_flickr,test_2017_flickr}.{de,en}[.gz]``; None downloads them)."""
    if {src_lang, tgt_lang} != set(LANGS):
        raise ValueError("Multi30k here is German-English (either direction)")
    out_dir = Path(out_dir)
    sources = Sources(src, work_dir or out_dir / "orig", downloads())
    texts: Dict[str, Dict[str, list]] = {}
    subsets = {}
    for split, name in SPLITS:
        optional = split == "test1"
        s_path = sources.find(f"{name}.{src_lang}", f"{name}.{src_lang}.gz", required=not optional)
        t_path = sources.find(f"{name}.{tgt_lang}", f"{name}.{tgt_lang}.gz", required=not optional)
        if s_path is None or t_path is None:
            continue
        s, t = read_lines(s_path), read_lines(t_path)
        check_parallel(s, t, name)
        texts[split] = {src_lang: s, tgt_lang: t}
        if split != "train":
            # Raw copies for scoring: the references stay exactly as distributed.
            write_lines(out_dir / "text" / f"{split}.raw.{src_lang}", s)
            write_lines(out_dir / "text" / f"{split}.raw.{tgt_lang}", t)
            subsets[split] = {"name": name, "source": f"text/{split}.raw.{src_lang}",
                              "reference": f"text/{split}.raw.{tgt_lang}"}
    build_data_bin(out_dir, src_lang, tgt_lang, texts, vocab_size, workers=workers)
    write_metadata(out_dir, {
        "recipe": "multi30k",
        "source_lang": src_lang,
        "target_lang": tgt_lang,
        "spm_model": "spm.model",
        "output": "detokenized",
        "scores": ["sacrebleu", "tokenized_lowercased_bleu"],
        "subsets": subsets,
        "options": {"vocab_size": vocab_size, "subword": "sentencepiece-bpe"},
    })
    return out_dir
