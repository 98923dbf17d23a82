"""What the recipes share: locating the input files, writing the data-bin and its metadata."""

import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .binarize import fairseq_preprocess
from .download import download, extract, is_archive
from .io import find_file, log, read_lines, write_lines
from .subword import SentencePieceCodec, train_sentencepiece
from fairseq_sret import json_text

METADATA = "sret_data.json"


class Sources:
    """The folders in which a recipe looks for its input files.

    ``src`` is a folder with the official files (extracted or as downloaded archives),
    an archive, or None to download ``downloads`` (file name -> candidate URLs).
    Archives are unpacked into ``work_dir``.
    """

    def __init__(self, src, work_dir, downloads: Dict[str, Sequence[str]]):
        self.work_dir = Path(work_dir)
        self.roots: List[Path] = []
        if src is None:
            fetched = self.work_dir / "downloads"
            for name, urls in downloads.items():
                path = download(urls, fetched / name)
                if is_archive(path):
                    extract(path, self.work_dir / "extracted")
            self.roots = [fetched, self.work_dir / "extracted"]
            return
        src = Path(src)
        if src.is_file():
            if not is_archive(src):
                raise ValueError(f"{src} is neither a folder nor a .tgz/.tar.gz archive")
            extract(src, self.work_dir / "extracted")
            self.roots = [self.work_dir / "extracted"]
            return
        if not src.is_dir():
            raise FileNotFoundError(f"{src} does not exist")
        self.roots = [src]
        archives = sorted(p for p in src.iterdir() if p.is_file() and is_archive(p))
        for archive in archives:
            extract(archive, self.work_dir / "extracted")
        if archives:
            self.roots.append(self.work_dir / "extracted")

    def find(self, *names: str, required: bool = True) -> Optional[Path]:
        for root in self.roots:
            if root.is_dir():
                found = find_file(root, names, required=False)
                if found is not None:
                    return found
        if required:
            raise FileNotFoundError(
                f"none of {list(names)} found in {[str(r) for r in self.roots]}; "
                "the folder must hold the official files of the data set (see the recipe's --help)"
            )
        return None


def build_data_bin(
    out_dir,
    src_lang: str,
    tgt_lang: str,
    texts: Dict[str, Dict[str, List[str]]],
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    input_sentence_size: int = 0,
    workers: int = 1,
    spm_train_texts: Optional[Dict[str, List[str]]] = None,
    clean_encoded=None,
) -> Dict[str, Dict[str, List[str]]]:
    """Text -> joint SentencePiece model -> encoded text -> fairseq data-bin in ``out_dir``.

    ``texts[split][lang]`` are the lines (``split`` in train, valid, test, test1, ...);
    they are written to ``out_dir/text/{split}.{lang}``, the pieces to
    ``text/{split}.sp.{lang}``. ``clean_encoded(src_pieces, tgt_pieces) -> kept indices``
    optionally filters the encoded training pairs (WMT's length/ratio cleaning); the
    kept text replaces ``texts["train"]``. Returns the (possibly filtered) texts.
    """
    out_dir = Path(out_dir)
    text_dir = out_dir / "text"
    text_dir.mkdir(parents=True, exist_ok=True)
    train_files = []
    for lang in (src_lang, tgt_lang):
        lines = (spm_train_texts or texts["train"])[lang]
        path = text_dir / (f"spm_input.{lang}" if spm_train_texts else f"train.{lang}")
        write_lines(path, lines)
        train_files.append(path)
    model = train_sentencepiece(
        train_files, out_dir / "spm", vocab_size, model_type=model_type,
        character_coverage=character_coverage, input_sentence_size=input_sentence_size, threads=workers,
    )
    codec = SentencePieceCodec(model)
    encoded: Dict[str, Dict[str, List[str]]] = {}
    for split, by_lang in texts.items():
        encoded[split] = {}
        for lang in (src_lang, tgt_lang):
            log(f"encoding {split}.{lang} ({len(by_lang[lang]):,} lines)")
            encoded[split][lang] = codec.encode(by_lang[lang], threads=workers)
    if clean_encoded is not None:
        keep = clean_encoded(encoded["train"][src_lang], encoded["train"][tgt_lang])
        before = len(encoded["train"][src_lang])
        for lang in (src_lang, tgt_lang):
            encoded["train"][lang] = [encoded["train"][lang][i] for i in keep]
            texts["train"][lang] = [texts["train"][lang][i] for i in keep]
        log(f"cleaning kept {len(keep):,} of {before:,} training pairs")
    for split, by_lang in texts.items():
        for lang in (src_lang, tgt_lang):
            write_lines(text_dir / f"{split}.{lang}", by_lang[lang])
            write_lines(text_dir / f"{split}.sp.{lang}", encoded[split][lang])
    if spm_train_texts:
        for lang in (src_lang, tgt_lang):
            (text_dir / f"spm_input.{lang}").unlink(missing_ok=True)
    fairseq_preprocess(
        src_lang, tgt_lang, {split: text_dir / f"{split}.sp" for split in texts}, out_dir, workers=workers
    )
    return texts


def write_metadata(out_dir, metadata: dict) -> Path:
    """Write ``sret_data.json``. ``options.vocab_size`` becomes the size of the SentencePiece
    vocabulary that was made (a small corpus gives fewer pieces than asked for), the size asked
    for is kept as ``requested_vocab_size``, and ``dictionary_size`` counts the entries of the
    fairseq dictionary (special symbols included)."""
    out_dir = Path(out_dir)
    options = dict(metadata.get("options") or {})
    model = out_dir / metadata.get("spm_model", "spm.model")
    if "vocab_size" in options and model.is_file():
        import sentencepiece as spm

        made = spm.SentencePieceProcessor(model_file=str(model)).get_piece_size()
        options["requested_vocab_size"] = options["vocab_size"]
        options["vocab_size"] = made
        if made < options["requested_vocab_size"]:
            log(f"the corpus gives {made:,} SentencePiece pieces, fewer than the {options['requested_vocab_size']:,}"
                " asked for (--vocab-size): the vocabulary has its real size")
    dictionary = out_dir / f"dict.{metadata.get('source_lang')}.txt"
    if dictionary.is_file():
        options["dictionary_size"] = len(read_lines(dictionary)) + 4  # fairseq's <s>, <pad>, </s>, <unk>
    metadata = dict(metadata, options=options, created=time.strftime("%Y-%m-%d %H:%M:%S"))
    path = out_dir / METADATA
    path.write_text(json_text.dumps(metadata, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def read_metadata(data_dir) -> dict:
    path = Path(data_dir) / METADATA
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: the data-bin was not made by sret-prepare"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def read_parallel(sources: Sources, names_src: Sequence[str], names_tgt: Sequence[str], what: str):
    src = read_lines(sources.find(*names_src))
    tgt = read_lines(sources.find(*names_tgt))
    if len(src) != len(tgt):
        raise ValueError(f"{what}: {len(src)} source lines but {len(tgt)} target lines")
    log(f"{what}: {len(src):,} pairs")
    return src, tgt
