"""The BLEU variants reported for the NMT benchmarks, all computed with sacreBLEU.

* :func:`tokenized_bleu` -- BLEU on already tokenized text, split at spaces only
  (``multi-bleu.perl`` / ``fairseq-score``). For IWSLT'14 the text is the Moses-tokenized,
  lowercased output of prepare-iwslt14.sh: the number the IWSLT literature reports.
* :func:`sacrebleu_detok` -- sacreBLEU on detokenized output against the untouched
  references, with its signature (``lowercase=True`` for lowercased systems such as IWSLT).
* :func:`compound_split_bleu` -- WMT'14 En-De as in Vaswani et al. / fairseq's
  ``compound_split_bleu.sh``: Moses-tokenize output and references, split hyphenated
  compounds into ``a ##AT##-##AT## b``, tokenized case-sensitive BLEU.
* :func:`tokenized_lowercased_bleu` -- Moses-tokenize and lowercase both sides, then
  tokenized BLEU (the ``lc.tok`` BLEU often quoted for Multi30k).
* :func:`chrf` -- sacreBLEU's chrF2 (character n-gram F-score) of detokenized output.
"""

from dataclasses import asdict, dataclass
from typing import List, Sequence

from ..data.text import compound_split, moses_tokenize


@dataclass
class BleuResult:
    name: str
    score: float
    #: sacreBLEU's one-line summary: precisions, brevity penalty, lengths.
    detail: str
    #: sacreBLEU's signature of the settings (``nrefs:1|case:lc|eff:no|tok:13a|...``).
    signature: str

    def line(self) -> str:
        return f"{self.name}: {self.score:.2f}  ({self.detail})  signature: {self.signature}"

    def as_dict(self) -> dict:
        return asdict(self)


def _bleu(name: str, hyps: Sequence[str], refs: Sequence[str], **options) -> BleuResult:
    from sacrebleu.metrics import BLEU

    hyps, refs = list(hyps), list(refs)
    if len(hyps) != len(refs):
        raise ValueError(f"{name}: {len(hyps)} hypotheses but {len(refs)} references")
    metric = BLEU(**options)
    result = metric.corpus_score(hyps, [refs])
    # "BLEU = 27.31 58.1/33.0/20.9/13.6 (BP = 1.000 ...)" -> "58.1/33.0/... (BP = ...)"
    detail = str(result).split("=", 1)[-1].strip().split(" ", 1)[-1]
    return BleuResult(name, float(result.score), detail, str(metric.get_signature()))


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], name: str = "tokenized BLEU") -> BleuResult:
    """Case-sensitive BLEU of pre-tokenized text (tokens = space-separated)."""
    return _bleu(name, hyps, refs, tokenize="none", force=True)


def sacrebleu_detok(hyps: Sequence[str], refs: Sequence[str], lowercase: bool = False, tokenize: str = "13a",
                    name: str = "sacreBLEU") -> BleuResult:
    """sacreBLEU of detokenized output against raw references."""
    return _bleu(name, hyps, refs, lowercase=lowercase, tokenize=tokenize)


def moses_tokenize_all(lines: Sequence[str], lang: str, lowercase: bool = False) -> List[str]:
    out = [moses_tokenize(x, lang) for x in lines]
    return [x.lower() for x in out] if lowercase else out


def compound_split_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str = "de", tokenize: bool = True,
                        name: str = "compound-split BLEU") -> BleuResult:
    """Tokenized BLEU after ``##AT##`` compound splitting (``tokenize=False`` if the
    inputs are Moses-tokenized already, as in fairseq's compound_split_bleu.sh)."""
    if tokenize:
        hyps, refs = moses_tokenize_all(hyps, lang), moses_tokenize_all(refs, lang)
    return tokenized_bleu([compound_split(x) for x in hyps], [compound_split(x) for x in refs], name=name)


def tokenized_lowercased_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str,
                              name: str = "tokenized lowercased BLEU") -> BleuResult:
    return tokenized_bleu(moses_tokenize_all(hyps, lang, True), moses_tokenize_all(refs, lang, True), name=name)


def chrf(hyps: Sequence[str], refs: Sequence[str], lowercase: bool = False, name: str = "chrF2") -> BleuResult:
    """sacreBLEU's chrF (character 6-grams, beta 2) of detokenized output, with its signature."""
    from sacrebleu.metrics import CHRF

    hyps, refs = list(hyps), list(refs)
    if len(hyps) != len(refs):
        raise ValueError(f"{name}: {len(hyps)} hypotheses but {len(refs)} references")
    metric = CHRF(lowercase=lowercase)
    result = metric.corpus_score(hyps, [refs])
    return BleuResult(name, float(result.score), str(result), str(metric.get_signature()))
