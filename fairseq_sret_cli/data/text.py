"""Text processing of the classic NMT recipes, in Python.

The Moses perl scripts that fairseq's ``prepare-iwslt14.sh`` / ``prepare-wmt14en2de.sh``
call are replaced by sacremoses plus a few lines reproducing the scripts exactly:

* ``tokenizer.perl`` -> :func:`moses_tokenize` (sacremoses, plus the rule of current
  tokenizer.perl that always splits the period of a segment's last word, which
  sacremoses lacks: without it 0.2% of the IWSLT test lines differ).
* ``lowercase.perl`` -> ``str.lower``.
* ``clean-corpus-n.perl`` -> :func:`clean_parallel`.
* ``normalize-punctuation.perl`` / ``remove-non-printing-char.perl`` ->
  :func:`normalize_punctuation` / :func:`remove_non_printing`.
* the ``grep``/``sed`` extraction of ``<seg>`` text -> :func:`xml_segments` (IWSLT, the
  sed expressions of prepare-iwslt14.sh) and :func:`sgm_segments` (WMT, sacreBLEU's).
"""

import functools
import re
import unicodedata
from multiprocessing import Pool
from typing import Callable, Iterable, List, Sequence, Tuple

from .io import LineProgress, log, read_lines


# ------------------------------------------------------------------ Moses tokenization
@functools.lru_cache(maxsize=None)
def _moses_tokenizer(lang: str):
    from sacremoses import MosesTokenizer

    class PerlCompatibleTokenizer(MosesTokenizer):
        """sacremoses' tokenizer plus tokenizer.perl's last-word period rule."""

        def handles_nonbreaking_prefixes(self, text):
            tokens = text.split()
            if tokens:
                last = re.search(r"^(\S+)\.$", tokens[-1])
                if last:  # "split last words independently as they are unlikely to be
                    tokens[-1] = last.group(1) + " ."  # non-breaking prefixes"
            return super().handles_nonbreaking_prefixes(" ".join(tokens))

    return PerlCompatibleTokenizer(lang=lang)


@functools.lru_cache(maxsize=None)
def _moses_detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


@functools.lru_cache(maxsize=None)
def _punct_normalizer(lang: str):
    from sacremoses import MosesPunctNormalizer

    return MosesPunctNormalizer(lang=lang)


def moses_tokenize(line: str, lang: str, aggressive_dash_splits: bool = False, escape: bool = True) -> str:
    """``tokenizer.perl -l LANG [-a]`` on one line (XML-escaping like the perl default)."""
    return _moses_tokenizer(lang).tokenize(
        line, aggressive_dash_splits=aggressive_dash_splits, return_str=True, escape=escape
    )


def moses_detokenize(line: str, lang: str) -> str:
    """``detokenizer.perl -l LANG`` on one line (un-escapes ``&apos;`` etc.)."""
    return _moses_detokenizer(lang).detokenize(line.split(), return_str=True)


def normalize_punctuation(line: str, lang: str) -> str:
    """``normalize-punctuation.perl -l LANG``."""
    return _punct_normalizer(lang).normalize(line)


def remove_non_printing(line: str) -> str:
    """``remove-non-printing-char.perl``: every Unicode "other" character (``\\p{C}``) -> space."""
    if line.isprintable():  # fast path: no C* (nor Z* other than " ") characters at all
        return line
    return "".join(" " if unicodedata.category(c).startswith("C") else c for c in line)


def tokenize_lowercase(line: str, lang: str) -> str:
    """IWSLT'14: ``tokenizer.perl -l LANG | lowercase.perl``."""
    return moses_tokenize(line, lang).lower()


def wmt_normalize(line: str, lang: str) -> str:
    """WMT'14 training text: normalize-punctuation + remove-non-printing-char."""
    return remove_non_printing(normalize_punctuation(line, lang))


# ------------------------------------------------------------------ parallel map
def _apply(args):
    fn, chunk, kwargs = args
    return [fn(x, **kwargs) for x in chunk]


def _leave_interrupts_to_the_parent() -> None:
    """Workers ignore Ctrl-C: the command stops them and says so in one line (else every worker
    prints its own traceback)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def map_lines(fn: Callable, lines: Sequence[str], workers: int = 1, what: str = "", chunk: int = 2000, **kwargs) -> List[str]:
    """``[fn(line, **kwargs) for line in lines]``, optionally in ``workers`` processes,
    logging progress for big inputs. ``fn`` must be a module-level function."""
    chunks = [lines[i : i + chunk] for i in range(0, len(lines), chunk)]
    progress = LineProgress(what or getattr(fn, "__name__", "processing"), every=max(chunk, 100_000), total=len(lines))
    out: List[str] = []
    if workers > 1 and len(chunks) > 1:
        with Pool(workers, initializer=_leave_interrupts_to_the_parent) as pool:
            for part in pool.imap(_apply, [(fn, c, kwargs) for c in chunks]):
                out.extend(part)
                progress.add(len(part))
    else:
        for c in chunks:
            part = _apply((fn, c, kwargs))
            out.extend(part)
            progress.add(len(part))
    return out


# ------------------------------------------------------------------ cleaning
def clean_indices(
    src: Sequence[str],
    tgt: Sequence[str],
    ratio: float = 9.0,
    min_len: int = 1,
    max_len: int = 175,
    max_word_length: int = 1000,
) -> Tuple[List[int], List[str], List[str]]:
    """``clean-corpus-n.perl -ratio RATIO CORPUS src tgt OUT MIN MAX``.

    Collapses whitespace (and drops ``|`` unless the first pair looks factored), then
    keeps a pair when both sides are non-empty, have MIN..MAX words, a word-count ratio
    of at most RATIO either way, and no word longer than ``max_word_length`` characters.
    Returns the indices of the kept pairs and their (whitespace-normalized) text.
    """
    if len(src) != len(tgt):
        raise ValueError(f"parallel files differ in length: {len(src)} vs {len(tgt)}")
    space = re.compile(r"\s+")
    too_long = re.compile(r"[^\s|]{%d}" % (max_word_length + 1))
    factored = bool(src) and ("|" in src[0] or "|" in tgt[0])
    keep, out_src, out_tgt = [], [], []
    for i, (f, e) in enumerate(zip(src, tgt)):
        if not factored:
            f, e = f.replace("|", ""), e.replace("|", "")
        f = space.sub(" ", f).strip(" ")
        e = space.sub(" ", e).strip(" ")
        if not f or not e:
            continue
        fc, ec = len(f.split(" ")), len(e.split(" "))
        if fc > max_len or ec > max_len or fc < min_len or ec < min_len:
            continue
        if ec / fc > ratio or fc / ec > ratio:
            continue
        if too_long.search(f) or too_long.search(e):
            continue
        keep.append(i)
        out_src.append(f)
        out_tgt.append(e)
    return keep, out_src, out_tgt


def clean_parallel(src: Sequence[str], tgt: Sequence[str], **kwargs) -> Tuple[List[str], List[str]]:
    """The kept pairs of :func:`clean_indices` (what clean-corpus-n.perl writes)."""
    _, out_src, out_tgt = clean_indices(src, tgt, **kwargs)
    return out_src, out_tgt


# ------------------------------------------------------------------ extraction
_SEG_OPEN = re.compile(r'<seg id="[0-9]*">[ \t\n\r\f\v]*')
_SEG_CLOSE = re.compile(r"[ \t\n\r\f\v]*</seg>[ \t\n\r\f\v]*")


def xml_segments(path, normalize_quote: bool = True) -> List[str]:
    """IWSLT dev/test XML -> segment text, exactly as prepare-iwslt14.sh extracts it::

        grep '<seg id' | sed 's/<seg id="[0-9]*">\\s*//g' | sed 's/\\s*<\\/seg>\\s*//g' | sed "s/’/'/g"

    ``normalize_quote=False`` skips the last step (the untouched text, for references).
    """
    out = []
    for line in read_lines(path):
        if "<seg id" not in line:
            continue
        line = _SEG_CLOSE.sub("", _SEG_OPEN.sub("", line))
        out.append(line.replace("\u2019", "'") if normalize_quote else line)
    return out


def sgm_segments(path) -> List[str]:
    """WMT SGML -> segment text, as sacreBLEU extracts it (no un-escaping)."""
    out = []
    for line in read_lines(path):
        if line.startswith("<seg "):
            text = re.sub(r"<seg.*?>(.*)</seg>.*?", "\\1", line)
            out.append(re.sub(r"\s+", " ", text.strip()))
    return out


def iwslt_train_filter(lines: Iterable[str]) -> List[str]:
    """The meta-data filter prepare-iwslt14.sh applies to ``train.tags.de-en.*``::

        grep -v '<url>' | grep -v '<talkid>' | grep -v '<keywords>' | sed -e 's/<title>//g' ...

    (drop url/talkid/keywords lines, strip the title/description tags and keep their text).
    """
    out = []
    for line in lines:
        if "<url>" in line or "<talkid>" in line or "<keywords>" in line:
            continue
        for tag in ("<title>", "</title>", "<description>", "</description>"):
            line = line.replace(tag, "")
        out.append(line)
    return out


def compound_split(line: str) -> str:
    """``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`` (fairseq's compound_split_bleu.sh).

    Perl's ``/g`` resumes after each match, so ``a-b-c`` becomes ``a ##AT##-##AT## b-c``;
    the regex here behaves identically.
    """
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line)


def check_parallel(src: Sequence[str], tgt: Sequence[str], what: str) -> None:
    if len(src) != len(tgt):
        raise ValueError(f"{what}: source has {len(src)} lines, target {len(tgt)}")
    if not any(line.strip() for line in src) or not any(line.strip() for line in tgt):
        raise ValueError(f"{what}: no text (the {'source' if not any(l.strip() for l in src) else 'target'}"
                         " file is empty or blank)")
    log(f"{what}: {len(src):,} pairs")
