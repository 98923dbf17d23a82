"""The spec classes and the vision factory check every value they are given, once, at
construction: a field of the wrong type or out of range is one ValueError naming it, never a
model built without what the value asked for (an NLL ratio of NaN, an empty stack of layers)
nor a traceback from deep inside torch."""

import dataclasses
import math

import pytest

from fairseq_sret.core import EncoderDecoderSpec, RecursionSchedule, RecursionSpec, SideSpec, SReTLayerSpec

SCHEDULE = RecursionSchedule.parse(2)
RECURSION = RecursionSpec(embed_dim=8, schedule=SCHEDULE)
LAYER = SReTLayerSpec(recursion=RECURSION, num_heads=2, ffn_dim=16)
SIDE = SideSpec(layer=LAYER, layers=1)
VALID = {
    RecursionSpec: dict(embed_dim=8, schedule=SCHEDULE),
    SReTLayerSpec: dict(recursion=RECURSION, num_heads=2, ffn_dim=16),
    SideSpec: dict(layer=LAYER, layers=1),
    EncoderDecoderSpec: dict(encoder=SIDE, decoder=SIDE),
}
#: values no field of the annotated type can take
BAD = {
    int: [0, -1, 2.5, True, float("nan"), "8", None],
    float: [float("nan"), float("inf"), -1.0, True, "0.1", None],
    bool: [1, 0, "yes", None],
    str: [3, None, "no-such-activation"],
}


def bad_values(field):
    if field.type in BAD:
        return BAD[field.type]
    return [None, 2, "x", LAYER if field.type is not SReTLayerSpec else SIDE]  # a spec or schedule field


CASES = [(cls, field.name, value) for cls in VALID for field in dataclasses.fields(cls) for value in bad_values(field)]


@pytest.mark.parametrize("cls, name, value", CASES, ids=[f"{c.__name__}.{n}={v!r}"[:60] for c, n, v in CASES])
@pytest.mark.reliability("one-line-errors")
def test_every_spec_field_refuses_a_value_of_the_wrong_type_or_range(cls, name, value):
    with pytest.raises(ValueError) as error:
        cls(**dict(VALID[cls], **{name: value}))
    message = str(error.value)
    assert f"{cls.__name__}.{name}" in message and "\n" not in message


def test_the_valid_specs_build_and_rates_take_their_whole_range():
    for cls, values in VALID.items():
        cls(**values)
    recursion = RecursionSpec(**dict(VALID[RecursionSpec], dropout=0, nll_ratio=0, norm_eps=1e-12))
    SReTLayerSpec(**dict(VALID[SReTLayerSpec], recursion=recursion, drop_path=0.999))
    with pytest.raises(ValueError, match=r"RecursionSpec\.dropout must be a number in \[0, 1\), got 1"):
        RecursionSpec(**dict(VALID[RecursionSpec], dropout=1))
    with pytest.raises(ValueError, match=r"SReTLayerSpec\.attention_dropout must be a number in \[0, 1\), got 1"):
        SReTLayerSpec(**dict(VALID[SReTLayerSpec], attention_dropout=1))
    with pytest.raises(ValueError, match="num_heads=3 must divide embed_dim=8"):
        SReTLayerSpec(**dict(VALID[SReTLayerSpec], num_heads=3))


def test_the_layer_reads_each_shared_value_from_its_recursion():
    """The values the block shares with its NLLs live once, in the layer's RecursionSpec."""
    recursion = RecursionSpec(**dict(VALID[RecursionSpec], nll_ratio=0.5, dropout=0.1, activation="relu"))
    layer = SReTLayerSpec(**dict(VALID[SReTLayerSpec], recursion=recursion))
    assert layer.recursion is recursion
    for name in ("embed_dim", "schedule", "lrc", "nll_ratio", "activation", "dropout", "activation_dropout",
                 "norm_eps", "checkpoint"):
        assert getattr(layer, name) == getattr(recursion, name), name
    assert math.isclose(layer.nll_ratio, 0.5) and layer.activation == "relu"
    with pytest.raises(dataclasses.FrozenInstanceError):
        layer.dropout = 0.2
    assert {f.name for f in dataclasses.fields(SReTLayerSpec)}.isdisjoint(f.name for f in dataclasses.fields(RecursionSpec))


vision = pytest.importorskip("fairseq_sret.vision")

#: create_model's overrides of every model: values of the wrong type or range
BAD_KWARGS = [
    ("num_classes", 2.5), ("num_classes", -1), ("num_classes", True), ("num_classes", "10"),
    ("in_chans", 0), ("img_size", (32,)), ("img_size", 0), ("img_size", 32.0),
    ("drop_path_rate", float("nan")), ("drop_rate", 1.0), ("attn_drop_rate", -0.1),
]


@pytest.mark.parametrize("name, value", BAD_KWARGS)
@pytest.mark.reliability("one-line-errors")
def test_every_vision_model_refuses_overrides_of_the_wrong_type_before_it_is_built(name, value):
    for model in vision.list_models():
        with pytest.raises(ValueError) as error:
            vision.create_model(model, **{name: value})
        assert str(error.value).startswith(f"create_model: {name} must be "), (model, str(error.value))
