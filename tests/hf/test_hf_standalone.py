"""An exported SReT model folder used with transformers alone (no fairseq installed, as a
transformers user has it): a model and tokenizer made here, saved with ``save_pretrained``,
load through the Auto classes and translate with ``generate()`` and the pipeline.

The equivalence with fairseq itself is tests/hf/test_modeling.py's (it needs fairseq); these
run in both test environments, and are the transformers tests of the fairseq-free one.
"""

import pytest
import torch

pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

import fairseq_sret.hf  # noqa: E402,F401  (registers the Auto classes and the pipeline)
from fairseq_sret.hf import SReTConfig, SReTForConditionalGeneration, SReTTokenizer  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

SENTENCES = ["ein Hund läuft über die Straße .", "eine Frau spielt mit dem Ball .", "zwei Kinder schlafen im Wasser .",
             "der Mann sieht einen roten Ball .", "ein kleines Kind läuft ."] * 20


def write_tokenizer(folder):
    """A SentencePiece model of the sentences and a fairseq dictionary of its pieces (joint)."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "spm"), vocab_size=40,
                                   model_type="bpe", character_coverage=1.0, bos_id=-1, eos_id=-1, unk_id=0,
                                   minloglevel=2)
    processor = spm.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    pieces = sorted({p for s in SENTENCES for p in processor.encode(s, out_type=str)})
    (folder / "dict.txt").write_text("".join(f"{p} 1\n" for p in pieces), encoding="utf-8")
    return SReTTokenizer(folder / "spm.model", folder / "dict.txt", folder / "dict.txt")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    tokenizer = write_tokenizer(root / "tok")
    torch.manual_seed(0)
    config = SReTConfig(vocab_size=len(tokenizer.source_symbols), encoder_embed_dim=32, decoder_embed_dim=32,
                        encoder_ffn_embed_dim=48, decoder_ffn_embed_dim=48, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_layers=2, decoder_layers=2, encoder_recursions=2,
                        decoder_recursions=2, encoder_groups="2,1", decoder_groups="1", dropout=0.0,
                        share_all_embeddings=True, nll_ratio=0.5)
    model = SReTForConditionalGeneration(config).eval()
    with torch.no_grad():  # trained-like coefficients and NLLs, so that every path is exercised
        for name, parameter in model.named_parameters():
            if "lrc" in name or "nll" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    folder = root / "exported"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, folder


def sources(tokenizer, count=4):
    return tokenizer(SENTENCES[:count], return_tensors="pt", padding=True)


def test_the_folder_loads_through_the_auto_classes_with_the_same_outputs(exported):
    model, folder = exported
    loaded = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert type(loaded) is SReTForConditionalGeneration and isinstance(tokenizer, SReTTokenizer)
    batch = sources(tokenizer)
    prev = torch.full((4, 3), 2)
    with torch.no_grad():
        expected = model(**batch, decoder_input_ids=prev).logits
        actual = loaded(**batch, decoder_input_ids=prev).logits
    assert torch.equal(actual, expected)
    assert tokenizer.decode(tokenizer(SENTENCES[0])["input_ids"], skip_special_tokens=True) == SENTENCES[0]


@pytest.mark.parametrize("beams", [1, 3])
def test_generate_with_the_cache_equals_generate_without(exported, beams):
    _, folder = exported
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    batch = sources(AutoTokenizer.from_pretrained(folder))
    settings = dict(num_beams=beams, max_new_tokens=8, do_sample=False)
    with torch.no_grad():
        cached = model.generate(**batch, **settings, use_cache=True, output_scores=True, return_dict_in_generate=True)
        plain = model.generate(**batch, **settings, use_cache=False, output_scores=True, return_dict_in_generate=True)
    assert torch.equal(cached.sequences, plain.sequences)
    assert cached.sequences.shape[0] == 4 and cached.sequences.shape[1] > 1


def test_depth_on_demand_from_pretrained(exported):
    model, folder = exported
    shallow = AutoModelForSeq2SeqLM.from_pretrained(folder, encoder_depth=1, decoder_depth=1).eval()
    batch = sources(AutoTokenizer.from_pretrained(folder))
    prev = torch.full((4, 3), 2)
    with torch.no_grad():
        with model.at_depth(1, 1):
            expected = model(**batch, decoder_input_ids=prev).logits
        full = model(**batch, decoder_input_ids=prev).logits
        actual = shallow(**batch, decoder_input_ids=prev).logits
    assert torch.allclose(actual, expected, atol=1e-6) and not torch.allclose(actual, full, atol=1e-3)


def test_the_pipeline_translates_raw_text(exported):
    _, folder = exported
    translate = pipeline("sret-translation", model=str(folder))
    results = [result[0]["translation_text"] for result in translate(SENTENCES[:2], max_new_tokens=6)]
    assert len(results) == 2 and all(isinstance(text, str) for text in results)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        ids = model.generate(**tokenizer(SENTENCES[:1], return_tensors="pt"), max_new_tokens=6)
    assert results[0] == tokenizer.decode(ids[0], skip_special_tokens=True)


def test_the_pipeline_batches_by_length_and_answers_in_order(exported, monkeypatch):
    _, folder = exported
    translate = pipeline("sret-translation", model=str(folder))
    texts = ["ein Hund .", SENTENCES[0] + " " + SENTENCES[1], "eine Frau spielt .", SENTENCES[2]]
    one_by_one = [translate(text, max_new_tokens=6) for text in texts]
    batches = []
    generate = translate.model.generate
    monkeypatch.setattr(translate.model, "generate", lambda **kw: batches.append(kw["input_ids"]) or generate(**kw))
    assert translate(texts, batch_size=2, max_new_tokens=6) == one_by_one
    lengths = [int(row.ne(translate.tokenizer.pad_token_id).sum()) for batch in batches for row in batch]
    assert len(batches) == 2 and lengths == sorted(lengths)


@pytest.mark.reliability("inputs-as-they-seem")
def test_a_dictionary_saved_on_windows_reads_as_the_same_symbols(tmp_path):
    from fairseq_sret.hf.tokenization import read_fairseq_dictionary

    plain, windows = tmp_path / "dict.txt", tmp_path / "dict.windows.txt"
    plain.write_bytes("▁Hund 5\nKatze 3\n".encode())
    windows.write_bytes("\ufeff▁Hund 5\r\nKatze 3\r\n".encode())
    assert read_fairseq_dictionary(windows) == read_fairseq_dictionary(plain) == ["<s>", "<pad>", "</s>", "<unk>",
                                                                                  "▁Hund", "Katze"]


BROKEN_TORCHAUDIO = """
import json, logging
logging.basicConfig(level=logging.INFO, format="%(name)s | %(message)s")
import transformers.utils.import_utils as import_utils
own = import_utils.is_torchaudio_available
import fairseq_sret.hf
from fairseq_sret.hf.transformers_patches import TRANSFORMERS_PATCHES
import transformers.pipelines  # imports torchaudio where transformers believes it available
applied = dict(TRANSFORMERS_PATCHES.applied)
TRANSFORMERS_PATCHES.remove()
print(json.dumps({"applied": applied, "restored": import_utils.is_torchaudio_available is own}))
"""


@pytest.mark.parametrize("broken", [True, False])
def test_a_torchaudio_that_fails_to_import_does_not_break_the_pipelines(broken, tmp_path):
    """transformers imports an installed torchaudio with its pipelines; one built for another
    torch fails to import, and the adapter's patch tells transformers it is absent."""
    import json
    import os
    import subprocess
    import sys

    from conftest import REPO

    if broken:  # an installed torchaudio package whose import fails, as one built for another torch
        (tmp_path / "torchaudio").mkdir()
        (tmp_path / "torchaudio" / "__init__.py").write_text('raise OSError("libtorchaudio.so: undefined symbol")\n')
        (tmp_path / "torchaudio-9.9.dist-info").mkdir()
        (tmp_path / "torchaudio-9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torchaudio\n"
                                                                        "Version: 9.9\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    env.pop("SRET_TRANSFORMERS_PATCHES", None)
    out = subprocess.run([sys.executable, "-c", BROKEN_TORCHAUDIO], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if broken:
        assert result == {"applied": {"unimportable_torchaudio": "applied"}, "restored": True}
    else:  # no torchaudio, or one that imports: nothing to do
        assert result["applied"] == {"unimportable_torchaudio": "not needed"}
    assert "transformers patches applied: " in out.stderr
