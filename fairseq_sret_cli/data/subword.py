"""Joint SentencePiece vocabularies: train on both languages, encode, decode."""

from pathlib import Path
from typing import List, Sequence

from .io import log


def train_sentencepiece(
    files: Sequence,
    model_prefix,
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    input_sentence_size: int = 0,
    threads: int = 1,
    seed: int = 1,
) -> Path:
    """Train one SentencePiece model on all ``files`` (a joint vocabulary); returns the .model path.

    ``normalization_rule_name="identity"``: decoding gives back exactly the text that was
    encoded (up to whitespace), which the BLEU variants rely on. ``hard_vocab_limit`` is
    off, so a small corpus yields a smaller vocabulary instead of an error.
    ``input_sentence_size`` > 0 samples that many sentences (for WMT-sized corpora).
    """
    import sentencepiece as spm

    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    log(f"training SentencePiece {model_type} model, vocabulary {vocab_size} on {len(files)} files")
    kwargs = dict(
        input=[str(f) for f in files],
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        normalization_rule_name="identity",
        hard_vocab_limit=False,
        num_threads=max(1, threads),
        minloglevel=2,
        # fairseq adds its own <pad>/<s>/</s>/<unk>; keep SentencePiece's ids out of the text.
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
    )
    if input_sentence_size:
        kwargs.update(input_sentence_size=input_sentence_size, shuffle_input_sentence=True)
    if hasattr(spm, "set_random_generator_seed"):  # reproducible sampling of big corpora
        spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(**kwargs)
    return Path(str(model_prefix) + ".model")


class SentencePieceCodec:
    """Encode lines to space-separated pieces and decode them back."""

    def __init__(self, model_file):
        import sentencepiece as spm

        self.model_file = str(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=self.model_file)

    def encode(self, lines: Sequence[str], threads: int = 1, chunk: int = 100_000) -> List[str]:
        """Space-separated pieces of each line (in chunks: WMT has millions of lines)."""
        out: List[str] = []
        for start in range(0, len(lines), chunk):
            part = list(lines[start : start + chunk])
            try:
                encoded = self.sp.encode(part, out_type=str, num_threads=max(1, threads))
            except TypeError:  # sentencepiece without num_threads
                encoded = self.sp.encode(part, out_type=str)
            out.extend(" ".join(pieces) for pieces in encoded)
            if len(lines) > chunk:
                log(f"  {min(start + chunk, len(lines)):,}/{len(lines):,} lines")
        return out

    @staticmethod
    def decode(line: str) -> str:
        """Pieces -> text, as fairseq's ``--post-process sentencepiece`` does (works for
        any piece string, also with fairseq's ``<unk>`` in it)."""
        return line.replace(" ", "").replace("\u2581", " ").strip()
