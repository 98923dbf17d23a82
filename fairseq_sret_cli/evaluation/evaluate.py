"""From a checkpoint to the BLEU scores of a prepared data set.

The data-bin's ``sret_data.json`` (written by the prepare scripts) says which references
exist and which BLEU variants the literature reports for the data set:

==========  ===========================================================================
iwslt14     tokenized BLEU vs. the Moses-tokenized lowercased references (the IWSLT
            literature's number) and lowercased sacreBLEU of the detokenized output
wmt14       sacreBLEU (cased, 13a) and compound-split tokenized BLEU
multi30k    sacreBLEU (cased, 13a) and tokenized lowercased BLEU
==========  ===========================================================================

Every data set with raw references also gets chrF2 (lowercased where the system output is).

A data-bin made directly with ``fairseq-preprocess`` (no ``sret_data.json``) is scored
against its own binarised targets, as fairseq-generate prints them (``T-`` lines), with
sacreBLEU and chrF2 on the text as binarised (no subword or detokenization step).
"""

import os
import re
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..data.common import METADATA, read_metadata
from ..data.io import read_lines, write_lines
from ..data.subword import SentencePieceCodec
from ..data.text import moses_detokenize
from . import bleu
from .generate import generation_speed, read_hypotheses, run_generate
from fairseq_sret import json_text


_BINARISED = re.compile(r"^(?P<subset>[^.]+)\.(?P<src>[^.-]+)-(?P<tgt>[^.-]+)\.(?P=src)\.idx$")


def data_bin_metadata(data_dir) -> dict:
    """What scoring needs to know of a data-bin: its ``sret_data.json``, or for a data-bin made
    with ``fairseq-preprocess`` alone, the languages and subsets its file names give (``recipe``
    ``fairseq-preprocess``; ``references`` ``binarised``: the targets as stored).

    Raises ``FileNotFoundError`` for a folder that is missing or holds no fairseq data-bin.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data-bin {data_dir} does not exist")
    if (data_dir / METADATA).is_file():
        return read_metadata(data_dir)
    found = [m for m in map(_BINARISED.match, sorted(p.name for p in data_dir.iterdir())) if m]
    directions = sorted({(m["src"], m["tgt"]) for m in found})
    if not directions or not any((data_dir / f"dict.{lang}.txt").is_file() for lang in directions[0]):
        raise FileNotFoundError(f"{data_dir} is not a fairseq data-bin: no dict.LANG.txt with"
                                " SUBSET.SRC-TGT.SRC.idx/.bin files (make it with fairseq-preprocess or sret-prepare)")
    if len(directions) > 1:
        raise ValueError(f"{data_dir} holds several language pairs {['-'.join(d) for d in directions]}; "
                         "give it a data-bin of one pair")
    src, tgt = directions[0]
    subsets = [m["subset"] for m in found if (data_dir / f"{m['subset']}.{src}-{tgt}.{tgt}.idx").is_file()]
    return {"recipe": "fairseq-preprocess", "source_lang": src, "target_lang": tgt, "references": "binarised",
            "scores": ["sacrebleu"], "subsets": {name: {"name": name} for name in subsets}}


def read_targets(generate_output) -> Dict[int, str]:
    """The ``T-`` lines (references as binarised) of a fairseq-generate output, by sentence id."""
    targets = {}
    for line in Path(generate_output).read_text(encoding="utf-8").split("\n"):
        if line.startswith("T-"):
            fields = line.split("\t", 1)
            targets[int(fields[0][2:])] = fields[1] if len(fields) > 1 else ""
    return targets


def score_binarised(hyps: Dict[int, str], refs: Dict[int, str]) -> List[bleu.BleuResult]:
    """sacreBLEU and chrF2 of the hypotheses against the data-bin's own targets."""
    ids = sorted(refs)
    h, r = [hyps.get(i, "") for i in ids], [refs[i] for i in ids]
    return [bleu.sacrebleu_detok(h, r, name="sacreBLEU (binarised text)"), bleu.chrf(h, r, name="chrF2 (binarised text)")]


def score(meta: dict, data_dir, subset: str, hyps: List[str]) -> List[bleu.BleuResult]:
    """All BLEU variants ``meta`` lists for ``subset`` whose references are available."""
    data_dir = Path(data_dir)
    info = meta["subsets"].get(subset, {})
    tgt = meta["target_lang"]

    def ref(key):
        return read_lines(data_dir / info[key]) if key in info else None

    results = []
    for name in meta["scores"]:
        if name == "tokenized_bleu" and "reference_tokenized" in info:
            results.append(bleu.tokenized_bleu(hyps, ref("reference_tokenized"),
                                               name="tokenized BLEU (Moses-tokenized, lowercased)"))
        elif name == "sacrebleu_lc" and "reference" in info:
            detok = [moses_detokenize(h, tgt) for h in hyps]
            results.append(bleu.sacrebleu_detok(detok, ref("reference"), lowercase=True,
                                                name="sacreBLEU (detokenized, lowercased)"))
        elif name == "sacrebleu" and "reference" in info:
            results.append(bleu.sacrebleu_detok(hyps, ref("reference"), name="sacreBLEU"))
        elif name == "compound_split_bleu" and "reference" in info:
            results.append(bleu.compound_split_bleu(hyps, ref("reference"), lang=tgt))
        elif name == "tokenized_lowercased_bleu" and "reference" in info:
            results.append(bleu.tokenized_lowercased_bleu(hyps, ref("reference"), lang=tgt))
    if "reference" in info:
        lowercased = "sacrebleu_lc" in meta["scores"]
        detok = [moses_detokenize(h, tgt) for h in hyps] if lowercased else hyps
        results.append(bleu.chrf(detok, ref("reference"), lowercase=lowercased,
                                 name="chrF2 (lowercased)" if lowercased else "chrF2"))
    return results


_SUMMARY = re.compile(r"^Generate (?P<subset>\S+) with beam=(?P<beam>\d+): ", re.M)


def generate_output_facts(generate_output) -> dict:
    """What a fairseq-generate output says of itself: ``{"sources": {id: S- line}, "hypotheses":
    count, "subset", "beam"}`` (the last two from its closing BLEU line, None without it)."""
    text = Path(generate_output).read_text(encoding="utf-8")
    sources = {}
    for line in text.split("\n"):
        if line.startswith("S-"):
            fields = line.split("\t", 1)
            if fields[0][2:].isdigit():
                sources[int(fields[0][2:])] = fields[1] if len(fields) > 1 else ""
    summary = _SUMMARY.search(text)
    return {"sources": sources, "hypotheses": sum(1 for line in text.split("\n") if line.startswith("H-")),
            "subset": summary["subset"] if summary else None, "beam": int(summary["beam"]) if summary else None}


def check_generate_output(generate_output, data_dir, subset: str, meta: dict, beam: Optional[int]) -> dict:
    """Refuse a fairseq-generate output that is empty, or was made for another subset, beam or
    data set (its S- lines are not this data-bin's source sentences); returns its facts."""
    facts = generate_output_facts(generate_output)
    if not facts["hypotheses"]:
        raise ValueError(f"{generate_output} holds no hypotheses (H- lines): give the generate-SUBSET.txt that"
                         " fairseq-generate wrote (--results-path)")
    if facts["subset"] is None:
        raise ValueError(f"{generate_output} is incomplete: it lacks fairseq-generate's closing line ('Generate"
                         f" {subset} with beam=N: ...'), so it was cut off or is still being written; give the"
                         " complete file")
    if facts["hypotheses"] < len(facts["sources"]):
        raise ValueError(f"{generate_output} is incomplete: {len(facts['sources']) - facts['hypotheses']} of its"
                         " source sentences have no hypothesis; give the complete file")
    if facts["subset"] is not None and facts["subset"] != subset:
        raise ValueError(f"{generate_output} translates the subset '{facts['subset']}', not '{subset}': pass"
                         f" --subset {facts['subset']}")
    if beam is not None and facts["beam"] is not None and facts["beam"] != beam:
        raise ValueError(f"{generate_output} was decoded with beam {facts['beam']}, not --beam {beam}: leave"
                         " --beam out (the file's beam is reported)")
    source = Path(data_dir) / "text" / f"{subset}.sp.{meta['source_lang']}"
    if meta.get("references") != "binarised" and source.is_file():
        pieces = read_lines(source)
        for i, line in sorted(facts["sources"].items()):
            if not (i < len(pieces) and _same_source(line, pieces[i])):
                raise ValueError(
                    f"{generate_output} was not made from the data-bin {data_dir}: its source sentence {i}"
                    f" is not line {i + 1} of {source.name}; score it with the --data it was translated from")
    return facts


def last_value(tokens: Sequence[str], option: str, default):
    """The value of the last ``option`` among command-line ``tokens`` (``--option V`` or
    ``--option=V``, as argparse reads them: the last one counts), or ``default``."""
    value = default
    for i, token in enumerate(tokens):
        if token == option and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif token.startswith(option + "="):
            value = token.split("=", 1)[1]
    return value


def subset_size(data_dir, subset: str, meta: dict) -> Optional[int]:
    """How many sentences the binarised ``subset`` holds (the header of its target ``.idx``
    file, as fairseq-preprocess writes it), or None for an index of another format."""
    pair = f"{meta['source_lang']}-{meta['target_lang']}"
    with open(Path(data_dir) / f"{subset}.{pair}.{meta['target_lang']}.idx", "rb") as f:
        header = f.read(26)
    if len(header) < 26 or header[:9] != b"MMIDIDX\x00\x00":
        return None
    return struct.unpack("<Q", header[18:26])[0]


def check_all_translated(refs: Dict[int, str], data_dir, subset: str, meta: dict, generate_output) -> None:
    """Refuse a fairseq-generate output that does not hold every sentence of ``subset`` (fairseq
    skipped some, or it was made from a part of it or from another data-bin): the references
    are read from the output, so the score would be of other sentences than the subset's."""
    size = subset_size(data_dir, subset, meta)
    if size is not None and len(refs) != size:
        raise ValueError(f"{generate_output} holds {len(refs)} translated sentences, but the subset '{subset}' of"
                         f" {data_dir} has {size} (fairseq skipped some, or the output is of a part of it or of"
                         " another data-bin): its score would not be the subset's; translate the whole subset")


def readable_again(path, scratch) -> Path:
    """``path``, or where it is not a regular file (a pipe, ``<(...)``, a FIFO: each read would
    see the rest of the stream, the second nothing), a copy of its text, read once, in the
    folder ``scratch``."""
    path = Path(path)
    if path.is_file() or not path.exists():
        return path
    copy = Path(scratch) / "generate-output.txt"
    copy.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    return copy


def _same_source(printed: str, pieces: str) -> bool:
    """fairseq prints a source as binarised: the same pieces, with ``<unk>`` for unknown ones."""
    a, b = printed.split(), pieces.split()
    return len(a) == len(b) and all(x == y or x == "<unk>" for x, y in zip(a, b))


def evaluate(data_dir, checkpoint=None, subset: str = "test", output_dir=None, generate_output=None,
             **kwargs) -> Dict:
    """Translate ``subset`` with ``checkpoint`` (or read an existing fairseq-generate output)
    and score it. Writes ``generate-SUBSET.txt`` (when it translates), ``SUBSET.hyp`` and
    ``SUBSET.results.json`` to ``output_dir`` (default: beside the checkpoint or output, in
    ``eval``): all are made in a hidden folder there, then each moved in by one rename,
    the results last, so a failure or an interruption leaves ``output_dir`` as it was. An
    existing output is checked first (:func:`check_generate_output`); its own beam is reported
    (``beam`` None: whatever it was decoded with). Other arguments: those of :func:`_evaluate`."""
    if output_dir is None:
        output_dir = (Path(checkpoint).parent if checkpoint else Path(generate_output).parent) / "eval"
    output_dir = Path(output_dir)
    made = not output_dir.exists()
    output_dir.mkdir(parents=True, exist_ok=True)
    staging = output_dir / f".sret-evaluate.{os.getpid()}"
    try:
        with tempfile.TemporaryDirectory(prefix="sret-evaluate-") as scratch:
            report = _evaluate(data_dir, checkpoint=checkpoint, subset=subset, output_dir=output_dir,
                               generate_output=generate_output, staging=staging, scratch=scratch, **kwargs)
        for name in output_files(subset, generated=generate_output is None):
            os.replace(staging / name, output_dir / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if made and not any(output_dir.iterdir()):  # a failure leaves no trace of a folder it made
            output_dir.rmdir()
    return report


def _evaluate(
    data_dir,
    checkpoint=None,
    subset: str = "test",
    output_dir=None,
    generate_output=None,
    beam: Optional[int] = 5,
    lenpen: Optional[float] = 1.0,
    max_tokens: int = 8000,
    batch_size: Optional[int] = None,
    cpu: bool = False,
    extra_args: Sequence[str] = (),
    verbose: bool = False,
    staging=None,
    scratch=None,
) -> Dict:
    """:func:`evaluate`'s work: its files are written to ``staging`` and name ``output_dir``,
    where they go; ``scratch``: a folder for a once-read copy of a piped output."""
    data_dir = Path(data_dir)
    meta = data_bin_metadata(data_dir)
    if subset not in meta["subsets"]:
        raise ValueError(f"no references for subset {subset!r} in {data_dir}; known: {sorted(meta['subsets'])}")
    output_dir, staging = Path(output_dir), Path(staging)
    speed = None
    if generate_output is None:
        if checkpoint is None:
            raise ValueError("give a checkpoint or a fairseq-generate output")
        generate_output, summary = run_generate(data_dir, checkpoint, staging, subset=subset, beam=beam, lenpen=lenpen,
                                                max_tokens=max_tokens, batch_size=batch_size, cpu=cpu,
                                                extra_args=extra_args, verbose=verbose)
        speed = generation_speed(summary)
        given = output_dir / generate_output.name
        # extra options (an experiment's variant) may decode with another beam or length penalty
        beam = generate_output_facts(generate_output)["beam"] or beam
        lenpen = last_value(extra_args, "--lenpen", lenpen)
        lenpen = None if lenpen is None else float(lenpen)
    else:
        given, generate_output = generate_output, readable_again(generate_output, scratch)
        facts = check_generate_output(generate_output, data_dir, subset, meta, beam)
        beam, lenpen = facts["beam"], None  # the file's own beam; its length penalty is not in it
    if meta.get("references") == "binarised":
        refs = read_targets(generate_output)
        check_all_translated(refs, data_dir, subset, meta, given)
        hyps = read_hypotheses(generate_output, max(refs, default=-1) + 1)
        num = len(refs)
        results = score_binarised(dict(enumerate(hyps)), refs)
    else:
        num = len(read_lines(data_dir / "text" / f"{subset}.sp.{meta['target_lang']}"))
        hyps = [SentencePieceCodec.decode(p) for p in read_hypotheses(generate_output, num)]
        results = score(meta, data_dir, subset, hyps)
    staging.mkdir(parents=True, exist_ok=True)
    write_lines(staging / f"{subset}.hyp", hyps)
    report = {
        "data": str(data_dir),
        "recipe": meta["recipe"],
        "direction": f"{meta['source_lang']}-{meta['target_lang']}",
        "subset": subset,
        "subset_name": meta["subsets"][subset].get("name", subset),
        "sentences": num,
        "checkpoint": str(Path(checkpoint).resolve()) if checkpoint else None,
        "generate_output": str(given),
        "hypotheses": str(output_dir / f"{subset}.hyp"),
        "beam": beam,
        "lenpen": lenpen,
        "generate_args": list(extra_args),
        "speed": speed,
        "scores": [r.as_dict() for r in results],
    }
    (staging / f"{subset}.results.json").write_text(json_text.dumps(report, indent=2, ensure_ascii=False) + "\n",
                                                   encoding="utf-8")
    return report


def output_files(subset: str, generated: bool = True) -> List[str]:
    """The files :func:`evaluate` writes in its output folder (``generated``: with a
    fairseq-generate run of its own)."""
    return ([f"generate-{subset}.txt"] if generated else []) + [f"{subset}.hyp", f"{subset}.results.json"]


def format_report(report: Dict) -> str:
    decoding = ", ".join(f"{k} {report[k]}" for k in ("beam", "lenpen") if report.get(k) is not None)
    lines = [f"{report['recipe']} {report['direction']}, {report['subset_name']} ({report['sentences']} sentences"
             + (f", {decoding})" if decoding else ")")]
    if report.get("checkpoint"):
        lines.append(f"checkpoint: {report['checkpoint']}")
    for s in report["scores"]:
        lines.append(bleu.BleuResult(**s).line())
    lines.append(f"hypotheses: {report['hypotheses']}")
    return "\n".join(lines)
