"""The exported transformers model answers a bad input with one line naming it (a ValueError
or TypeError of the library, no traceback from inside transformers, sentencepiece or torch):
configuration values of the wrong type, missing tokenizer files, text that is not Unicode,
search settings out of range, weights in a precision the CPU does not run. No fairseq needed."""

import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

import fairseq_sret.hf  # noqa: E402,F401
from fairseq_sret.hf import SReTConfig, SReTForConditionalGeneration  # noqa: E402
from fairseq_sret.hf.tokenization import VOCAB_FILES_NAMES  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline  # noqa: E402
from test_hf_standalone import write_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("errors")
    tokenizer = write_tokenizer(root / "tok")
    config = SReTConfig(vocab_size=len(tokenizer.source_symbols), encoder_embed_dim=16, decoder_embed_dim=16,
                        encoder_ffn_embed_dim=16, decoder_ffn_embed_dim=16, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_layers=1, decoder_layers=1, dropout=0.0,
                        share_all_embeddings=True)
    model = SReTForConditionalGeneration(config).eval()
    model.generation_config.max_new_tokens = 5
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root / "model"


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message.strip(), message
    return message


def wrong_value(declared):
    """A JSON value of another type than the field's declared type."""
    text = str(declared)
    if "bool" in text:
        return "yes"
    if "int" in text:
        return "2"
    if "float" in text:
        return "0.1x"
    return 3  # str, dict


@pytest.mark.parametrize("name, declared", sorted(SReTConfig.__annotations__.items()))
@pytest.mark.reliability("one-line-errors")
def test_a_config_value_of_the_wrong_type_is_one_line_naming_the_field(name, declared, folder, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    settings = json.loads((bad / "config.json").read_text())
    settings[name] = wrong_value(declared)
    (bad / "config.json").write_text(json.dumps(settings))
    with pytest.raises(ValueError) as error:
        AutoModelForSeq2SeqLM.from_pretrained(bad)
    assert one_line(error).startswith(f"SReTConfig.{name} must be "), str(error.value)


@pytest.mark.parametrize("name", list(VOCAB_FILES_NAMES.values()))
@pytest.mark.reliability("one-line-errors")
def test_a_missing_tokenizer_file_is_named(name, folder, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    (bad / name).unlink()
    with pytest.raises(ValueError) as error:
        AutoTokenizer.from_pretrained(bad)
    assert one_line(error).startswith(f"{bad / name}: missing"), str(error.value)


@pytest.mark.reliability("one-line-errors")
def test_text_that_is_not_unicode_is_one_line_and_no_texts_no_translations(folder):
    translate = pipeline("sret-translation", model=str(folder))
    assert translate([]) == [] and translate(()) == []
    for text in ("ein \ud800 Hund", "\udcff", ["ein Hund", "zwei \udfff"]):
        with pytest.raises(ValueError) as error:
            translate(text)
        assert "is not valid Unicode" in one_line(error)


#: generate()'s integer settings with the least value each takes, and its real settings
COUNTS = {"num_beams": 1, "num_return_sequences": 1, "max_new_tokens": 1, "max_length": 1, "min_new_tokens": 0,
          "min_length": 0, "top_k": 0, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0, "num_beam_groups": 1}
NUMBERS = ("length_penalty", "temperature", "top_p", "repetition_penalty")
BAD_SEARCH = [(name, value) for name, least in COUNTS.items() for value in (least - 1, 2.5, True)]
BAD_SEARCH += [(name, value) for name in NUMBERS for value in (float("nan"), "1")]


@pytest.mark.parametrize("name, value", BAD_SEARCH)
@pytest.mark.reliability("one-line-errors")
def test_a_search_setting_out_of_range_is_one_line_naming_it(name, value, folder):
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    batch = AutoTokenizer.from_pretrained(folder)(["ein Hund"], return_tensors="pt")
    with pytest.raises(ValueError) as error:
        model.generate(**batch, **{name: value})
    assert one_line(error).startswith(f"generate(): {name} must be ")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.reliability("one-line-errors")
def test_weights_in_half_precision_on_the_cpu_are_one_line(dtype, folder):
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, dtype=dtype)
    batch = AutoTokenizer.from_pretrained(folder)(["ein Hund"], return_tensors="pt")
    for run in (lambda: model.generate(**batch), lambda: model(**batch, decoder_input_ids=batch["input_ids"][:, :1])):
        with pytest.raises(ValueError) as error:
            run()
        assert one_line(error).startswith(f"this SReT model holds {dtype} weights on the CPU")


def test_a_generation_config_without_a_length_limit_generates(folder, tmp_path):
    plain = tmp_path / "plain"
    shutil.copytree(folder, plain)
    settings = json.loads((plain / "generation_config.json").read_text())
    settings.pop("max_new_tokens")
    (plain / "generation_config.json").write_text(json.dumps(settings))
    model = AutoModelForSeq2SeqLM.from_pretrained(plain)
    batch = AutoTokenizer.from_pretrained(plain)(["ein Hund"], return_tensors="pt")
    assert model.generate(**batch).shape[0] == 1


@pytest.mark.reliability("one-line-errors")
def test_a_cache_without_a_layer_for_every_recursion_is_one_line(folder):
    from transformers.cache_utils import Cache, DynamicLayer, EncoderDecoderCache

    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    batch = AutoTokenizer.from_pretrained(folder)(["ein Hund"], return_tensors="pt")
    # one shared decoder layer applied twice needs two self-attention layers; this cache holds one
    small = EncoderDecoderCache(Cache(layers=[DynamicLayer()]), Cache(layers=[DynamicLayer()]))
    with pytest.raises(ValueError) as error:
        model(**batch, decoder_input_ids=batch["input_ids"][:, :1], cache=small)
    assert one_line(error).startswith("this Cache holds 1 layers, SReT decoding needs layer 1 (one self-attention"
                                      " cache per recursion of every shared layer): pass cache=SReTCache()")
