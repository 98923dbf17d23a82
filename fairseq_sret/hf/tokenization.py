"""The tokenizer of an exported SReT model: the run's SentencePiece model for the pieces,
fairseq's dictionaries for the ids.

A trained model's ids are the line numbers of fairseq's ``dict.<lang>.txt`` behind fairseq's
four special symbols (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3), not SentencePiece's
ids. Encoding cuts raw text into SentencePiece pieces, maps each piece through the source
dictionary (unknown pieces to ``<unk>``) and appends ``</s>``, which gives the ids
``fairseq-preprocess`` wrote for the same line. Decoding maps ids through the target dictionary
and joins the pieces as fairseq's ``--post-process sentencepiece`` does (``▁`` becomes a space).

An exported folder records a fingerprint of each of these files (:func:`tokenizer_fingerprints`,
``tokenizer_fingerprints`` in ``config.json`` and ``tokenizer_config.json``); the tokenizer and
the model refuse a folder whose files no longer have them (:func:`check_tokenizer_files`).
"""

import hashlib
import os
import shutil
from typing import Dict, List, Mapping, Optional, Tuple

from transformers import PreTrainedTokenizer

FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
OVERWRITE_FLAG = "#fairseq:overwrite"
PIECE_SPACE = "\u2581"

VOCAB_FILES_NAMES = {
    "spm_file": "spm.model",
    "source_dict_file": "dict.source.txt",
    "target_dict_file": "dict.target.txt",
}


def read_fairseq_dictionary(path) -> List[str]:
    """The symbols of a fairseq dictionary file in id order: fairseq's special symbols, then one
    per line (``SYMBOL COUNT``, optionally ``#fairseq:overwrite``, which gives an existing symbol
    a new id). Raises ValueError naming the file and line for anything else."""
    symbols = list(FAIRSEQ_SPECIALS)
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")
            if number == 1:
                line = line.removeprefix("\ufeff")  # a byte order mark is not part of the first symbol
            overwrite = line.endswith(" " + OVERWRITE_FLAG)
            if overwrite:
                line = line[: -len(OVERWRITE_FLAG) - 1]
            symbol, _, count = line.rpartition(" ")
            if not symbol or not count.isdigit():
                raise ValueError(f"{path}:{number}: not a fairseq dictionary line (SYMBOL COUNT): {line!r}")
            if symbol in symbols and not overwrite:
                raise ValueError(f"{path}:{number}: symbol {symbol!r} is listed twice")
            symbols.append(symbol)
    return symbols


def dictionary_fingerprint(symbols: List[str]) -> str:
    """The fingerprint fairseq-sret records for a dictionary in a checkpoint (``{side}_dictionary_fingerprint``,
    :func:`fairseq_sret.models.sret_transformer.dictionaries.dictionary_fingerprint`): a hash of its
    symbols in id order."""
    return hashlib.sha256("\n".join(symbols).encode("utf-8")).hexdigest()[:16]


def file_fingerprint(name: str, path) -> str:
    """The fingerprint of the tokenizer file ``name`` at ``path``: a dictionary's
    :func:`dictionary_fingerprint` (its symbols in id order, however its lines end), the
    SentencePiece model's bytes' SHA-256 (its first 16 hex digits)."""
    if name.startswith("dict."):
        return dictionary_fingerprint(read_fairseq_dictionary(path))
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def tokenizer_fingerprints(spm_file, source_dict_file, target_dict_file) -> Dict[str, str]:
    """File name in an exported folder -> :func:`file_fingerprint` of the file given for it."""
    given = dict(zip(VOCAB_FILES_NAMES.values(), (spm_file, source_dict_file, target_dict_file)))
    return {name: file_fingerprint(name, path) for name, path in given.items()}


def check_tokenizer_files(files: Mapping[str, object], recorded: Optional[Mapping[str, str]]) -> None:
    """Refuse, with one line naming the file, a tokenizer file (name -> path) whose fingerprint is
    not the one its folder recorded at export (``recorded``; None: nothing recorded, nothing to
    check); a recorded file that is absent is named too."""
    if recorded is None:
        return
    if not isinstance(recorded, Mapping):
        raise ValueError(f"tokenizer_fingerprints must map file names to fingerprints, got {recorded!r}")
    for name, expected in recorded.items():
        path = files.get(name)
        if path is None or not os.path.isfile(path):  # a ValueError: transformers rewords an OSError
            raise ValueError(f"{path or name}: missing; the folder was exported with it (its fingerprint is recorded)")
        actual = file_fingerprint(name, path)
        if actual != expected:
            raise ValueError(f"{path}: not the {name} this folder was exported with (fingerprint {actual}, the folder"
                             f" records {expected}): restore the file, or export the model again")


def _index(symbols: List[str]) -> Dict[str, int]:
    """symbol -> id; a symbol listed again (overwrite) maps to its last id, as in fairseq."""
    return {symbol: i for i, symbol in enumerate(symbols)}


class SReTTokenizer(PreTrainedTokenizer):
    """SentencePiece pieces with fairseq's dictionary ids (see the module docstring).

    Files: ``spm.model`` (the run's SentencePiece model), ``dict.source.txt`` and
    ``dict.target.txt`` (the run's fairseq dictionaries, the same file for a joint vocabulary).
    """

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self, spm_file=None, source_dict_file=None, target_dict_file=None, bos_token="<s>", pad_token="<pad>",
        eos_token="</s>", unk_token="<unk>", tokenizer_fingerprints=None, **kwargs,
    ):
        import sentencepiece

        given = dict(zip(VOCAB_FILES_NAMES.values(), (spm_file, source_dict_file, target_dict_file)))
        folder = kwargs.get("name_or_path") or ""
        for name, path in given.items():
            if path is None or not os.path.isfile(path):  # a ValueError: transformers rewords an OSError
                shown = path if path is not None else os.path.join(folder, name) if folder else name
                raise ValueError(f"{shown}: missing; an SReT tokenizer needs {', '.join(VOCAB_FILES_NAMES.values())}")
        check_tokenizer_files(given, tokenizer_fingerprints)
        self.spm_file, self.source_dict_file, self.target_dict_file = spm_file, source_dict_file, target_dict_file
        try:
            self.spm = sentencepiece.SentencePieceProcessor(model_file=str(spm_file))
        except (RuntimeError, OSError) as exc:
            raise ValueError(f"{spm_file}: not a SentencePiece model ({str(exc).splitlines()[0]})") from None
        self.source_symbols = read_fairseq_dictionary(source_dict_file)
        self.target_symbols = read_fairseq_dictionary(target_dict_file)
        self.source_index, self.target_index = _index(self.source_symbols), _index(self.target_symbols)
        self.current_index = self.source_index
        kwargs.setdefault("model_max_length", 1024)
        kwargs.setdefault("split_special_tokens", True)  # raw text is cut by SentencePiece only, as for fairseq
        super().__init__(bos_token=bos_token, pad_token=pad_token, eos_token=eos_token, unk_token=unk_token,
                         tokenizer_fingerprints=tokenizer_fingerprints, **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.source_symbols)

    def get_vocab(self) -> Dict[str, int]:
        return dict(self.source_index)

    def _tokenize(self, text: str, **kwargs) -> List[str]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # sentencepiece fails on it without saying where
            raise ValueError(f"text {text[max(exc.start - 20, 0):exc.end + 20]!r} is not valid Unicode: {exc.reason}"
                             f" at character {exc.start}") from None
        return self.spm.encode(text, out_type=str)

    def _convert_token_to_id(self, token: str) -> int:
        return self.current_index.get(token, self.current_index[FAIRSEQ_SPECIALS[3]])

    def _convert_id_to_token(self, index: int) -> str:
        return self.target_symbols[index] if 0 <= index < len(self.target_symbols) else FAIRSEQ_SPECIALS[3]

    def _switch_to_input_mode(self) -> None:
        self.current_index = self.source_index

    def _switch_to_target_mode(self) -> None:
        self.current_index = self.target_index

    def convert_tokens_to_string(self, tokens: List[str]) -> str:
        """Pieces -> text as fairseq's ``--post-process sentencepiece``."""
        return "".join(tokens).replace(PIECE_SPACE, " ").strip()

    def build_inputs_with_special_tokens(self, token_ids_0: List[int], token_ids_1: Optional[List[int]] = None) -> List[int]:
        """fairseq's binarised sentence: the ids, then ``</s>``."""
        ids = token_ids_0 if token_ids_1 is None else token_ids_0 + token_ids_1
        return ids + [self.eos_token_id]

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 1

    def get_special_tokens_mask(
        self, token_ids_0: List[int], token_ids_1: Optional[List[int]] = None, already_has_special_tokens: bool = False,
    ) -> List[int]:
        ids = token_ids_0 if token_ids_1 is None else token_ids_0 + token_ids_1
        special = {self.bos_token_id, self.pad_token_id, self.eos_token_id}
        mask = [int(i in special) for i in ids]
        return mask if already_has_special_tokens else mask + [1]

    def save_vocabulary(self, save_directory: str, filename_prefix: Optional[str] = None) -> Tuple[str, ...]:
        saved = []
        for attribute, name in VOCAB_FILES_NAMES.items():
            target = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + name)
            source = getattr(self, attribute)
            if os.path.abspath(source) != os.path.abspath(target):
                shutil.copyfile(source, target)
            saved.append(target)
        return tuple(saved)
