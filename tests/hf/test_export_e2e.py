"""End to end with the command-line tools: sret-prepare a toy Multi30k-shaped corpus,
fairseq-train a small SReT model for a few updates, sret-export-hf it, and compare the
exported model with fairseq: fairseq-generate's beam-5 hypotheses on the test set equal
generate()'s and the pipeline's translations of the raw German text, and the teacher-forced
logits equal those of the model fairseq's own loader builds. Also: the core and vision
packages import without transformers, fairseq_sret.hf without fairseq."""

import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("fairseq")

from cli_helpers import ENV, SRET, TRAIN, run  # noqa: E402
from test_modeling import toy_batch, write_toy_multi30k  # noqa: E402

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(data-bin, checkpoint, exported folder) of a toy run made with the command-line tools."""
    root = tmp_path_factory.mktemp("hf_e2e")
    raw = write_toy_multi30k(root / "raw")
    run("sret-prepare", "multi30k", "--src", raw, "--out", root / "bin", "--vocab-size", "80")
    run("fairseq-train", root / "bin", *SRET, *TRAIN, "--max-update", "60", "--save-dir", root / "ckpt")
    checkpoint = root / "ckpt" / "checkpoint_last.pt"
    run("sret-export-hf", checkpoint, "--data-bin", root / "bin", "--out", root / "hf")
    return root / "bin", checkpoint, root / "hf"


def fairseq_generate_hypotheses(data_bin, checkpoint, beam):
    from fairseq_sret_cli.evaluation.generate import read_hypotheses

    result = run("fairseq-generate", data_bin, "--path", checkpoint, *SRET[:2], "--gen-subset", "test",
                 "--beam", str(beam), "--batch-size", "8", "--cpu", "--required-batch-size-multiple", "1")
    output = data_bin.parent / f"generate-beam{beam}.txt"
    output.write_text(result.stdout, encoding="utf-8")
    return read_hypotheses(output)


@pytest.mark.parametrize("beam", [1, 5])
def test_exported_model_translates_as_fairseq_generate(trained, beam):
    import fairseq_sret.hf  # noqa: F401
    from fairseq_sret_cli.data.subword import SentencePieceCodec
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    data_bin, checkpoint, exported = trained
    expected = fairseq_generate_hypotheses(data_bin, checkpoint, beam)  # pieces, in sentence order
    raw = (data_bin / "text/test.raw.de").read_text(encoding="utf-8").splitlines()
    tokenizer = AutoTokenizer.from_pretrained(exported)
    model = AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    batch = tokenizer(raw, padding=True, return_tensors="pt")
    generated = model.generate(**batch, num_beams=beam)
    pieces = [" ".join(tokenizer.convert_ids_to_tokens(row[1:][row[1:].ne(1) & row[1:].ne(2)].tolist()))
              for row in generated]
    assert pieces == expected
    translate = pipeline("sret-translation", model=str(exported))
    texts = [out[0]["translation_text"] for out in translate(raw, num_beams=beam)]
    assert texts == [SentencePieceCodec.decode(h) for h in expected]


def test_teacher_forced_logits_equal_fairseqs_loader(trained):
    import fairseq_sret.hf  # noqa: F401
    from fairseq import checkpoint_utils
    from transformers import AutoModelForSeq2SeqLM

    data_bin, checkpoint, exported = trained
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data_bin)})
    ref = models[0].eval()
    src, lengths, prev = toy_batch(data_bin, task)
    ours = AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    with torch.no_grad():
        expected, _ = ref(src, lengths, prev)
        got = ours(input_ids=src, attention_mask=src.ne(1).long(), decoder_input_ids=prev).logits
    assert (got - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("code,absent", [
    ("import fairseq_sret.core, fairseq_sret.vision", "transformers"),
    ("import fairseq_sret.hf, fairseq_sret.hf.convert", "fairseq"),
])
def test_imports_stay_apart(code, absent):
    check = f"{code}; import sys; print({absent!r} in sys.modules)"
    result = subprocess.run([sys.executable, "-c", check], env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"
