"""The transformers export of sret_transformer models (fairseq_sret.hf) against fairseq itself.

- Teacher-forced logits of the exported model equal fairseq's (1e-5, fp32) on the sentences of
  a toy data-bin made by sret-prepare's Multi30k recipe: pre-LN, post-LN, groups 2,1, without
  NLL/LRC, separate embeddings, learned positions, mixed-depth and uptrained checkpoints, at
  full depth and at depth 1 (fairseq: a depth override; transformers: from_pretrained(...,
  encoder_depth=1)).
- Greedy and beam generate() give fairseq's SequenceGenerator hypotheses and scores.
- The cache: one self-attention cache per recursion, the encoder's keys/values projected once
  per shared decoder layer, beam reordering that leaves them alone; decoding without a cache
  and with a cache that reorders everything gives the same beams.
- Depth on demand: the core's check and fairseq's warning; tokenizer ids equal fairseq's
  binarised data; tied weights and the shared layers survive save -> load, stored once.
"""

import argparse
import copy
import json
import logging
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("fairseq")

import fairseq_sret.hf  # noqa: E402,F401  (registers the Auto classes)
from fairseq.sequence_generator import SequenceGenerator  # noqa: E402
from fairseq_sret.core import SlicedGroupAttention  # noqa: E402
from fairseq_sret.hf import SReTCache  # noqa: E402
from fairseq_sret.hf.convert import MARKER, export_checkpoint  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer  # noqa: E402
from transformers.cache_utils import DynamicCache, EncoderDecoderCache  # noqa: E402

from hf_helpers import (  # noqa: E402,F401  (perturb, write_toy_multi30k: other test modules import them here)
    MIXED_DEPTH, BinTask, fairseq_model, hydra_style, make_data_bin, perturb, sret_checkpoint, toy_batch,
    uptrained_checkpoint, write_toy_multi30k,
)

pytestmark = pytest.mark.usefixtures("single_thread")


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(tmp_path_factory.mktemp("hf_toy"))


@pytest.fixture(scope="module")
def task(data_bin):
    return BinTask(data_bin)


VARIANTS = {
    "pre-LN groups 2,1": dict(encoder_groups="2,1", decoder_groups="2,1"),
    "post-LN": dict(post_ln=True),
    "post-LN groups 2,1 strided": dict(post_ln=True, encoder_groups="2,1", decoder_groups="2,1",
                                       encoder_partition="strided", decoder_partition="strided"),
    "no NLL, no LRC": dict(nll_ratio=0.0, no_lrc=True),
    "separate embeddings, learned positions, embedding LayerNorm, unscaled": dict(
        share_all_embeddings=False, encoder_learned_pos=True, decoder_learned_pos=True, layernorm_embedding=True,
        no_scale_embedding=True),
    "3 recursions, 1 unique layer": dict(encoder_layers=1, decoder_layers=1, encoder_recursions=3,
                                         decoder_recursions=3, encoder_groups="2,1,1"),
    "mixed depth": dict(criterion=MIXED_DEPTH),
}


@pytest.fixture(scope="module")
def exported(data_bin, tmp_path_factory):
    """name -> (fairseq checkpoint state, exported folder), made once per variant."""
    root = tmp_path_factory.mktemp("hf_exports")
    made = {}

    def get(name):
        if name not in made:
            path = root / f"{len(made)}.pt"
            if name == "uptrained":
                state = uptrained_checkpoint(data_bin, path)
            elif name == "hydra-style":
                state = hydra_style(sret_checkpoint(data_bin, path, seed=len(made), encoder_groups="2,1"), path)
            else:
                state = sret_checkpoint(data_bin, path, seed=len(made), **VARIANTS[name])
            out = root / f"{len(made)}-hf"
            export_checkpoint(path, data_bin, out)
            made[name] = (state, out)
        return made[name]

    return get


def hf_logits(model, src, prev, pad=1):
    with torch.no_grad():
        return model(input_ids=src, attention_mask=src.ne(pad).long(), decoder_input_ids=prev).logits


# ---------------------------------------------------------------- logits
@pytest.mark.parametrize("name", [*VARIANTS, "uptrained", "hydra-style"])
@pytest.mark.parametrize("depth", [None, 1])
def test_teacher_forced_logits_equal_fairseq(exported, task, data_bin, name, depth):
    state, out = exported(name)
    ref = fairseq_model(state, task, depth)
    ours = AutoModelForSeq2SeqLM.from_pretrained(out, encoder_depth=depth, decoder_depth=depth).eval()
    assert ours.depth == ref.depth
    src, lengths, prev = toy_batch(data_bin, task)
    with torch.no_grad():
        expected, _ = ref(src, lengths, prev)
    assert (hf_logits(ours, src, prev) - expected).abs().max() <= 1e-5


def test_labels_give_fairseqs_inputs_and_loss(exported, task, data_bin):
    state, out = exported("post-LN")
    src, lengths, prev, target = toy_batch(data_bin, task, with_targets=True)
    with torch.no_grad():
        expected, _ = fairseq_model(state, task)(src, lengths, prev)
        output = AutoModelForSeq2SeqLM.from_pretrained(out).eval()(
            input_ids=src, attention_mask=src.ne(1).long(), labels=target)
    real = target.ne(task.target_dictionary.pad())  # past the end, HF feeds </s> where fairseq feeds padding
    assert (output.logits[real] - expected[real]).abs().max() <= 1e-5
    loss = torch.nn.functional.cross_entropy(expected.transpose(1, 2), target, ignore_index=task.target_dictionary.pad())
    assert abs(output.loss.item() - loss.item()) <= 1e-5


def test_padding_side_does_not_matter(exported, task, data_bin):
    state, out = exported("pre-LN groups 2,1")
    model = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    src, _, prev = toy_batch(data_bin, task)
    right = torch.full_like(src, 1)
    for i, row in enumerate(src):
        tokens = row[row.ne(1)]
        right[i, : len(tokens)] = tokens
    assert (hf_logits(model, right, prev) - hf_logits(model, src, prev)).abs().max() <= 1e-5


# ---------------------------------------------------------------- generation
def fairseq_hypotheses(model, task, src, lengths, beam, max_len_b):
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    hypos = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=max_len_b).forward(sample)
    return [h[0]["tokens"].tolist() for h in hypos], [h[0]["score"].item() for h in hypos]


def hf_hypotheses(model, src, beam, max_len_b, **kwargs):
    out = model.generate(input_ids=src, attention_mask=src.ne(1).long(), num_beams=beam,
                         max_new_tokens=max_len_b + 1, return_dict_in_generate=True, output_scores=True, **kwargs)
    hyps = []
    for row in out.sequences[:, 1:].tolist():  # without the start token; up to the first eos
        hyps.append(row[: row.index(2) + 1] if 2 in row else row)
    return hyps, out


@pytest.mark.parametrize("name", ["pre-LN groups 2,1", "post-LN groups 2,1 strided", "uptrained"])
@pytest.mark.parametrize("beam", [1, 5])
@pytest.mark.parametrize("depth", [None, 1])
def test_generate_equals_fairseq_sequence_generator(exported, task, data_bin, name, beam, depth):
    state, out = exported(name)
    ref = fairseq_model(state, task, depth)
    ours = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    src, lengths, _ = toy_batch(data_bin, task, count=8)
    expected, scores = fairseq_hypotheses(ref, task, src, lengths, beam, max_len_b=12)
    got, output = hf_hypotheses(ours, src, beam, 12, encoder_depth=depth, decoder_depth=depth)
    assert got == expected
    if beam > 1:
        assert torch.allclose(output.sequences_scores, torch.tensor(scores), atol=1e-5)
    assert ours.depth == (2, 2)  # generate()'s depth holds for that call only


def test_generated_defaults_are_fairseq_generates(exported, task, data_bin):
    """The exported generation settings alone (beam 5, max length 200 + eos) give fairseq-generate's output."""
    state, out = exported("pre-LN groups 2,1")
    src, lengths, _ = toy_batch(data_bin, task, count=6)
    expected, _ = fairseq_hypotheses(fairseq_model(state, task), task, src, lengths, beam=5, max_len_b=200)
    ours = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    got = [row[1: row.index(2, 1) + 1] for row in ours.generate(input_ids=src, attention_mask=src.ne(1).long()).tolist()]
    assert got == expected


# ---------------------------------------------------------------- int8
def prepared_for_generation(model, **common):
    """What fairseq-generate does to a loaded model before decoding."""
    model.prepare_for_inference_(argparse.Namespace(generation=argparse.Namespace(beam=5),
                                                    common=argparse.Namespace(**common)))
    return model


def test_int8_is_one_model_from_both_front_doors(exported, task, data_bin):
    """fairseq's ``--model-overrides "{'int8_in_generation': True}"`` and transformers'
    ``TorchAoConfig(int8_config())`` quantize the same layers the same way: equal logits and
    beams, which differ from fp32's logits (the quantization ran), close to them."""
    pytest.importorskip("torchao")
    from fairseq_sret.core.int8 import int8_config, is_int8
    from transformers import TorchAoConfig

    state, out = exported("pre-LN groups 2,1")
    state = dict(state, cfg=dict(state["cfg"], model=copy.deepcopy(state["cfg"]["model"])))
    fp32 = fairseq_model(state, task)
    state["cfg"]["model"].int8_in_generation = True
    state["cfg"]["model"].keep_lrc_in_generation = True  # transformers' model keeps them apart too
    ref = prepared_for_generation(fairseq_model(state, task))
    ours = AutoModelForSeq2SeqLM.from_pretrained(out, quantization_config=TorchAoConfig(int8_config())).eval()
    for model in (ref, ours):
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert sum(map(is_int8, linears)) == len(linears) - 1  # all but the tied output projection
    src, lengths, prev = toy_batch(data_bin, task)
    with torch.no_grad():
        expected, _ = ref(src, lengths, prev)
        full, _ = fp32(src, lengths, prev)
    got = hf_logits(ours, src, prev)
    assert (got - expected).abs().max() <= 1e-4
    assert 1e-4 < (expected - full).abs().max() < 0.1 * full.abs().max()
    src, lengths, _ = toy_batch(data_bin, task, count=8)
    assert hf_hypotheses(ours, src, 5, 12)[0] == fairseq_hypotheses(ref, task, src, lengths, 5, 12)[0]


def test_int8_generation_refuses_half_precision(exported, task):
    pytest.importorskip("torchao")
    state, _ = exported("pre-LN groups 2,1")
    state = dict(state, cfg=dict(state["cfg"], model=copy.deepcopy(state["cfg"]["model"])))
    state["cfg"]["model"].int8_in_generation = True
    with pytest.raises(ValueError, match="int8_in_generation quantizes the fp32 model.*drop --bf16"):
        prepared_for_generation(fairseq_model(state, task), bf16=True)


# ---------------------------------------------------------------- the cache
def test_one_self_attention_cache_per_recursion_and_encoder_keys_once(exported, task, data_bin, monkeypatch):
    _, out = exported("pre-LN groups 2,1")
    model = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    projections = []
    original = SlicedGroupAttention._project_kv

    def counting(self, memory):
        projections.append(memory.shape)
        return original(self, memory)

    monkeypatch.setattr(SlicedGroupAttention, "_project_kv", counting)
    src, _, _ = toy_batch(data_bin, task, count=3)
    cache = SReTCache()
    fed = model.generate(input_ids=src, attention_mask=src.ne(1).long(), num_beams=2, max_new_tokens=6,
                         min_new_tokens=3, cache=cache).shape[1] - 1  # the last token is not fed back
    layers, recursions = model.config.decoder_layers, model.config.decoder_recursions
    assert fed >= 3
    assert len(projections) == layers  # once per shared layer, not per recursion or step
    assert len(cache.cross_attention_cache.layers) == layers
    self_layers = cache.self_attention_cache.layers
    assert len(self_layers) == layers * recursions
    assert all(layer.keys.shape[-2] == fed for layer in self_layers)
    for i in range(layers):  # the applications of one shared layer keep their own keys
        assert not torch.equal(self_layers[i * recursions].keys, self_layers[i * recursions + 1].keys)


def test_beam_reordering_leaves_the_encoder_cache_alone():
    cache = SReTCache()
    keys = torch.randn(4, 2, 3, 8)
    cache.self_attention_cache.update(keys, keys + 1, 0)
    cache.cross_attention_cache.update(keys * 2, keys * 3, 0)
    cross = cache.cross_attention_cache.layers[0].keys
    cache.reorder_cache(torch.tensor([1, 0, 3, 2]))
    assert cache.cross_attention_cache.layers[0].keys is cross
    assert torch.equal(cache.self_attention_cache.layers[0].keys, keys[[1, 0, 3, 2]])
    cache.reorder_cache(torch.tensor([2, 3]))  # the batch shrinks: rows are selected
    assert torch.equal(cache.cross_attention_cache.layers[0].keys, cross[[2, 3]])


def test_beams_equal_without_cache_and_with_a_cache_that_reorders_everything(exported, task, data_bin):
    _, out = exported("post-LN groups 2,1 strided")
    model = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    src, _, _ = toy_batch(data_bin, task, count=6)
    ours, output = hf_hypotheses(model, src, 4, 10)
    full, full_output = hf_hypotheses(model, src, 4, 10, cache=EncoderDecoderCache(DynamicCache(), DynamicCache()))
    uncached, uncached_output = hf_hypotheses(model, src, 4, 10, use_cache=False)
    assert ours == full == uncached
    assert torch.equal(output.sequences_scores, full_output.sequences_scores)
    assert torch.allclose(output.sequences_scores, uncached_output.sequences_scores, atol=1e-5)


# ---------------------------------------------------------------- depth on demand
def test_depth_is_checked_like_fairseqs(exported):
    _, out = exported("pre-LN groups 2,1")
    with pytest.raises(ValueError, match=r"encoder_depth=3 is larger than the 2 recursions"):
        AutoModelForSeq2SeqLM.from_pretrained(out, encoder_depth=3)
    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    for bad in (0, "1"):
        with pytest.raises(ValueError, match="decoder depth must be an integer >= 1"):
            model.generate(input_ids=torch.tensor([[5, 2]]), decoder_depth=bad)
    assert model.depth == (2, 2)


@pytest.mark.parametrize("name,warns", [("pre-LN groups 2,1", True), ("mixed depth", False)])
def test_untrained_depth_warns_as_fairseq_does(exported, name, warns, caplog):
    _, out = exported(name)
    with caplog.at_level(logging.WARNING):
        model = AutoModelForSeq2SeqLM.from_pretrained(out, encoder_depth=1, decoder_depth=1)
    warned = [r.getMessage() for r in caplog.records if "trained only at its full depth" in r.getMessage()]
    assert bool(warned) == warns
    if warns:
        assert "--mixed-depth 1:0.5" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        model.set_depth(None, None)
    assert not [r for r in caplog.records if "trained only at its full depth" in r.getMessage()]


def test_depth_set_on_the_model_is_saved(exported, tmp_path):
    _, out = exported("pre-LN groups 2,1")
    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    model.set_depth(1, 2)
    model.save_pretrained(tmp_path / "shallow")
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "shallow").depth == (1, 2)


# ---------------------------------------------------------------- weights on disk
def applied_parameters(model) -> int:
    """Parameters counted once per application (a plain transformer of the same depth)."""
    total = sum(p.numel() for p in model.parameters())
    for side in (model.model.encoder, model.model.decoder):
        for recursive in side.layers:
            total += (recursive.depth - 1) * sum(p.numel() for p in recursive.layer.parameters())
    return total


def test_weights_are_stored_once_and_retied_on_load(exported, tmp_path):
    from safetensors import safe_open

    _, out = exported("pre-LN groups 2,1")
    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    embed = model.model.encoder.embed_tokens.weight
    assert embed is model.model.decoder.embed_tokens.weight is model.lm_head.weight
    unique = sum(p.numel() for p in model.parameters())
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        stored = {name: f.get_slice(name).get_shape() for name in f.keys()}
    assert sum(torch.Size(shape).numel() for shape in stored.values()) == unique
    size = (out / "model.safetensors").stat().st_size
    assert 4 * unique < size < 4 * unique + 65536 < 4 * applied_parameters(model)
    # save -> load keeps every tie and every value
    model.save_pretrained(tmp_path / "again")
    again = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "again")
    assert again.model.encoder.embed_tokens.weight is again.model.decoder.embed_tokens.weight is again.lm_head.weight
    before, after = dict(model.named_parameters()), dict(again.named_parameters())
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_separate_embeddings_stay_separate(exported):
    _, out = exported("separate embeddings, learned positions, embedding LayerNorm, unscaled")
    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    assert model.model.encoder.embed_tokens.weight is not model.model.decoder.embed_tokens.weight
    assert model.lm_head.weight is not model.model.decoder.embed_tokens.weight


# ---------------------------------------------------------------- tokenizer and pipeline
def test_tokenizer_gives_fairseqs_ids_and_text(exported, task, data_bin):
    from fairseq_sret_cli.data.subword import SentencePieceCodec

    _, out = exported("pre-LN groups 2,1")
    tokenizer = AutoTokenizer.from_pretrained(out)
    raw = (data_bin / "text/test.raw.de").read_text(encoding="utf-8").splitlines()
    pieces = (data_bin / "text/test.sp.en").read_text(encoding="utf-8").splitlines()
    d = task.source_dictionary
    assert tokenizer(raw).input_ids == [d.encode_line(p, add_if_not_exist=False).tolist() for p in
                                        (data_bin / "text/test.sp.de").read_text(encoding="utf-8").splitlines()]
    targets = [task.target_dictionary.encode_line(p, add_if_not_exist=False).tolist() for p in pieces]
    assert tokenizer.batch_decode(targets, skip_special_tokens=True) == [SentencePieceCodec.decode(p) for p in pieces]
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (d.pad(), d.eos(), d.unk())


def test_pipeline_translates_raw_text_as_fairseq(exported, task, data_bin):
    from transformers import pipeline

    from fairseq_sret_cli.data.subword import SentencePieceCodec

    state, out = exported("pre-LN groups 2,1")
    raw = (data_bin / "text/test.raw.de").read_text(encoding="utf-8").splitlines()[:3]
    translate = pipeline("sret-translation", model=str(out))
    got = [result[0]["translation_text"] for result in translate(raw, max_new_tokens=11)]
    src, lengths, _ = toy_batch(data_bin, task, count=3)
    hyps, _ = fairseq_hypotheses(fairseq_model(state, task), task, src, lengths, beam=5, max_len_b=10)
    expected = [SentencePieceCodec.decode(task.target_dictionary.string(torch.tensor(h))) for h in hyps]
    assert got == expected


def test_export_records_what_it_was_made_from(exported, data_bin):
    _, out = exported("pre-LN groups 2,1")
    record = json.loads((out / MARKER).read_text())
    assert record["made_by"] == "sret-export-hf" and Path(record["data_bin"]) == data_bin.resolve()
    assert (record["source_lang"], record["target_lang"]) == ("de", "en")
    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    assert record["unique_parameters"] == sum(p.numel() for p in model.parameters())
    assert record["depth"] == record["recursions"] == [2, 2]


# ---------------------------------------------------------------- configuration
@pytest.mark.parametrize("fields,message", [
    (dict(encoder_groups="2,1,1"), "encoder_groups has 3 values but there are 2 recursions"),
    (dict(decoder_groups="2", decoder_partition="contiguous"), "decoder_partition: 'contiguous' cannot be used"),
    (dict(encoder_recursions=0), "encoder_recursions must be an integer >= 1"),
    (dict(decoder_attention_heads=5), "decoder_attention_heads=5 must be >= 1 and divide decoder_embed_dim=512"),
    (dict(encoder_embed_dim=256, encoder_attention_heads=4), "encoder_embed_dim (256) must equal decoder_embed_dim"),
    (dict(activation_fn="swish"), "unknown activation 'swish'"),
    (dict(share_all_embeddings=True, vocab_size=10, decoder_vocab_size=12), "share_all_embeddings needs one dictionary"),
])
def test_configuration_errors_name_the_field(fields, message):
    from fairseq_sret.hf import SReTConfig

    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        SReTConfig(**fields)


def test_base_model_loads_from_an_export(exported, task, data_bin):
    from transformers import AutoModel

    from fairseq_sret.hf import SReTModel

    _, out = exported("pre-LN groups 2,1")
    base = AutoModel.from_pretrained(out).eval()
    full = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    assert isinstance(base, SReTModel)
    src, _, prev = toy_batch(data_bin, task, count=4)
    with torch.no_grad():
        features = base(input_ids=src, decoder_input_ids=prev).last_hidden_state
    assert (full.lm_head(features) - hf_logits(full, src, prev)).abs().max() <= 1e-6
