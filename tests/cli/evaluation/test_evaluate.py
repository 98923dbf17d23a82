"""evaluate(): reading a fairseq-generate output, decoding pieces and choosing the BLEU
variants from the data-bin's metadata (synthetic data, no model needed)."""

import json

import pytest

pytest.importorskip("sacrebleu")  # the 'fairseq' extra

import sacrebleu

from fairseq_sret_cli.data.io import write_lines
from fairseq_sret_cli.evaluation.evaluate import evaluate, format_report
from fairseq_sret_cli.evaluation.generate import read_hypotheses


def pieces(text: str) -> str:
    return " ".join("\u2581" + w for w in text.split())


def generate_output(path, hyps, skip=()):
    lines = []
    for i in reversed(range(len(hyps))):  # fairseq prints in batch order, not by id
        if i in skip:
            continue
        lines += [f"S-{i}\tsrc", f"T-{i}\tref", f"H-{i}\t-0.5\t{pieces(hyps[i])}", f"D-{i}\t-0.5\t{hyps[i]}", f"P-{i}\t-0.1"]
    lines.append("Generate test with beam=5: BLEU4 = 1.00")
    write_lines(path, lines)
    return path


def make_data(tmp_path, meta, files):
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name, lines in files.items():
        write_lines(tmp_path / name, lines)
    (tmp_path / "sret_data.json").write_text(json.dumps(meta))
    return tmp_path


def test_read_hypotheses_orders_by_id_and_fills_gaps(tmp_path):
    out = generate_output(tmp_path / "gen.txt", ["a b", "c", "d e f"], skip={1})
    assert read_hypotheses(out) == [pieces("a b"), pieces("d e f")]
    assert read_hypotheses(out, 3) == [pieces("a b"), "", pieces("d e f")]


def test_iwslt_style_scores(tmp_path):
    hyps = ["we do n&apos;t know .", "it &apos;s a &quot; big &quot; idea ."]
    refs_tok = ["we don &apos;t know .", "it &apos;s a &quot; big &quot; idea ."]
    refs_raw = ["We don't know.", 'It\'s a "big" idea.']
    meta = {"recipe": "iwslt14", "source_lang": "de", "target_lang": "en", "spm_model": "spm.model",
            "output": "tokenized_lowercased", "scores": ["tokenized_bleu", "sacrebleu_lc"],
            "subsets": {"test": {"name": "t", "reference": "text/test.raw.en", "reference_tokenized": "text/test.en"}}}
    data = make_data(tmp_path / "bin", meta, {"text/test.raw.en": refs_raw, "text/test.en": refs_tok,
                                              "text/test.sp.en": ["x", "y"]})
    gen = generate_output(tmp_path / "gen.txt", hyps)
    report = evaluate(data, generate_output=gen, output_dir=tmp_path / "eval")
    scores = {s["name"]: s for s in report["scores"]}
    tok = scores["tokenized BLEU (Moses-tokenized, lowercased)"]
    assert tok["score"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs_tok], tokenize="none").score)
    lc = scores["sacreBLEU (detokenized, lowercased)"]
    detok = ["we do n't know.", 'it\'s a "big" idea.']
    assert lc["score"] == pytest.approx(sacrebleu.corpus_bleu(detok, [refs_raw], lowercase=True).score)
    assert "case:lc" in lc["signature"]
    chrf = scores["chrF2 (lowercased)"]
    assert chrf["score"] == pytest.approx(sacrebleu.metrics.CHRF(lowercase=True).corpus_score(detok, [refs_raw]).score)
    assert "case:lc" in chrf["signature"]
    assert (tmp_path / "eval/test.hyp").read_text().splitlines() == hyps
    assert json.loads((tmp_path / "eval/test.results.json").read_text())["scores"] == report["scores"]
    assert "tokenized BLEU" in format_report(report)


def test_wmt_style_scores(tmp_path):
    hyps = ["Das Hotel-Zimmer ist schön.", "Er liest ein Buch."]
    refs = ["Das Hotel-Zimmer ist sehr schön.", "Er liest ein Buch."]
    meta = {"recipe": "wmt14", "source_lang": "en", "target_lang": "de", "spm_model": "spm.model",
            "output": "detokenized", "scores": ["sacrebleu", "compound_split_bleu"],
            "subsets": {"test": {"name": "newstest2014", "reference": "text/test.raw.de"}}}
    data = make_data(tmp_path / "bin", meta, {"text/test.raw.de": refs, "text/test.sp.de": ["x", "y"]})
    report = evaluate(data, generate_output=generate_output(tmp_path / "gen.txt", hyps), output_dir=tmp_path / "e")
    scores = {s["name"]: s["score"] for s in report["scores"]}
    assert scores["sacreBLEU"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    split = ["Das Hotel ##AT##-##AT## Zimmer ist schön .", "Er liest ein Buch ."]
    split_refs = ["Das Hotel ##AT##-##AT## Zimmer ist sehr schön .", "Er liest ein Buch ."]
    assert scores["compound-split BLEU"] == pytest.approx(
        sacrebleu.corpus_bleu(split, [split_refs], tokenize="none").score)
    assert scores["chrF2"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)


def test_unknown_subset(tmp_path):
    meta = {"recipe": "x", "source_lang": "de", "target_lang": "en", "scores": [], "subsets": {"test": {}}}
    data = make_data(tmp_path / "bin", meta, {})
    with pytest.raises(ValueError, match="valid"):
        evaluate(data, generate_output=tmp_path / "gen.txt", subset="valid")


def wmt_data(tmp_path, refs):
    meta = {"recipe": "wmt14", "source_lang": "en", "target_lang": "de", "spm_model": "spm.model",
            "output": "detokenized", "scores": ["sacrebleu"], "subsets": {"test": {"name": "t", "reference": "text/test.raw.de"}}}
    return make_data(tmp_path / "bin", meta, {"text/test.raw.de": refs, "text/test.sp.de": ["x"] * len(refs)})


@pytest.mark.parametrize("cut", ["the closing line", "a hypothesis"])
@pytest.mark.reliability("tied-to-inputs")
def test_an_incomplete_output_is_refused(tmp_path, cut):
    """A generate output cut off (or still being written) would score its missing sentences as
    empty: refused, naming the file."""
    hyps = ["Er liest.", "Sie schreibt.", "Es regnet."]
    data = wmt_data(tmp_path, hyps)
    gen = generate_output(tmp_path / "gen.txt", hyps)
    lines = gen.read_text().splitlines()
    lines = lines[:-1] if cut == "the closing line" else [line for line in lines if not line.startswith("H-1\t")]
    gen.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="gen.txt is incomplete"):
        evaluate(data, generate_output=gen, output_dir=tmp_path / "eval")
    assert not (tmp_path / "eval").exists()


@pytest.mark.reliability("tied-to-inputs")
def test_a_piped_output_is_read_once(tmp_path):
    """``--generate-output <(cat generate-test.txt)``: a stream gives its text to the first
    read only; the output is read once and scored as the file."""
    import os
    import threading

    hyps = ["Er liest.", "Sie schreibt."]
    data = wmt_data(tmp_path, ["Er liest ein Buch.", "Sie schreibt."])
    gen = generate_output(tmp_path / "gen.txt", hyps)
    expected = evaluate(data, generate_output=gen, output_dir=tmp_path / "file")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(gen.read_text()), daemon=True)
    writer.start()
    done = []  # a second read of the stream would wait for a writer that never comes
    reader = threading.Thread(target=lambda: done.append(evaluate(data, generate_output=fifo,
                                                                  output_dir=tmp_path / "piped")), daemon=True)
    reader.start()
    reader.join(120)
    assert done, "evaluate() still reading the pipe"
    report = done[0]
    assert report["scores"] == expected["scores"] and report["generate_output"] == str(fifo)
    assert (tmp_path / "piped/test.hyp").read_text() == (tmp_path / "file/test.hyp").read_text()
