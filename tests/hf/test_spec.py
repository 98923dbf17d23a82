"""One spec from every front door: the fairseq options of a model and the transformers
configuration it exports to read into the same core spec, and the layers of both models are
built from it."""

import pytest

pytest.importorskip("fairseq")
pytest.importorskip("transformers")

import fairseq_sret.hf  # noqa: E402,F401  (registers the model type)
from fairseq_sret.core import EncoderDecoderSpec  # noqa: E402
from fairseq_sret.hf import SReTForConditionalGeneration  # noqa: E402
from fairseq_sret.hf import configuration as hf_configuration  # noqa: E402
from fairseq_sret.hf.convert import sret_config  # noqa: E402
from fairseq_sret.models import sret_transformer  # noqa: E402
from nmt_helpers import SMALL, build  # noqa: E402

MODELS = {
    "default": {},
    "sliced": dict(encoder_groups="2,1", decoder_groups="2,1", decoder_partition="strided,random"),
    "shallower": dict(encoder_recursions=3, decoder_recursions=2, encoder_groups="4,2,1"),
    "run at depth 1": dict(encoder_recursions=2, encoder_depth=1, decoder_recursions=3, decoder_depth=1),
    "run at depth 1, as saved before --encoder-depth": dict(
        encoder_recursions=1, encoder_trained_recursions=2, decoder_recursions=1, decoder_trained_recursions=3),
    "post-ln, no LRC, narrow NLL": dict(post_ln=True, no_lrc=True, nll_ratio=0.5, activation_fn="gelu"),
    "no NLL, dropouts": dict(nll_ratio=0.0, dropout=0.1, attention_dropout=0.2, activation_dropout=0.3),
}


@pytest.mark.parametrize("overrides", MODELS.values(), ids=MODELS.keys())
def test_fairseq_options_and_exported_config_read_into_one_spec(overrides):
    model, task = build("sret_transformer", **{**SMALL, **overrides})
    fairseq_spec = sret_transformer.read_spec(model.args)
    config = sret_config({}, model.args, (len(task.source_dictionary), len(task.target_dictionary)), "test")
    hf_spec = hf_configuration.read_spec(config)

    assert isinstance(fairseq_spec, EncoderDecoderSpec)
    assert hf_spec == fairseq_spec
    for side in ("encoder", "decoder"):
        spec = fairseq_spec.side(side)
        recursions = getattr(model.args, f"{side}_recursions")
        assert (spec.recursions, spec.depth) == (recursions, getattr(model.args, f"{side}_depth") or recursions)
        # both models' layers are what the spec builds: same schedule, same parameter shapes
        fairseq_layers = getattr(model, side).layers
        hf_layers = getattr(SReTForConditionalGeneration(config).model, side).layers
        assert len(fairseq_layers) == len(hf_layers) == spec.layers
        for fairseq_layer, hf_layer in zip(fairseq_layers, hf_layers):
            assert fairseq_layer.recursive.schedule == hf_layer.schedule == spec.layer.schedule
            assert ({name: p.shape for name, p in fairseq_layer.recursive.named_parameters()}
                    == {name: p.shape for name, p in hf_layer.named_parameters()})


def test_spec_names_the_side():
    model, _ = build("sret_transformer", **SMALL)
    with pytest.raises(ValueError, match="side must be 'encoder' or 'decoder'"):
        sret_transformer.read_spec(model.args).side("middle")
