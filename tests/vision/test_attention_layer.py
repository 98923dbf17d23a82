"""The attention of the SReT and CCT image models is chosen by name (``attention_layer``): a
layer registered with ``register_attention_layer`` in this test module only is what the
models build, through ``create_model`` and timm; the default is today's model exactly."""

import pytest
import torch

from fairseq_sret.core import SlicedGroupAttention
from fairseq_sret.core.attention import ATTENTION_LAYERS, register_attention_layer
from fairseq_sret.vision import create_model

pytestmark = pytest.mark.usefixtures("single_thread")

MODELS = ["sret_cifar", "sret_cct_2_3x2_32"]


class CountingAttention(SlicedGroupAttention):
    """The sliced group attention, counting its calls: the same weights, a different class."""

    calls = 0

    def forward(self, *args, **kwargs):
        type(self).calls += 1
        return super().forward(*args, **kwargs)


@pytest.fixture
def counting():
    register_attention_layer("counting_sliced_group")(CountingAttention)
    CountingAttention.calls = 0
    yield "counting_sliced_group"
    ATTENTION_LAYERS.unregister("counting_sliced_group")


def seeded(name, **kwargs):
    torch.manual_seed(0)
    return create_model(name, **kwargs)


def attentions(model):
    return [m for m in model.modules() if isinstance(m, SlicedGroupAttention)]


@pytest.mark.parametrize("name", MODELS)
def test_a_registered_attention_layer_is_built_by_naming_it(name, counting):
    model = seeded(name, attention_layer=counting)
    default = seeded(name)
    assert model.cfg.attention_layer == counting and default.cfg.attention_layer == "sliced_group"
    assert attentions(model) and all(type(a) is CountingAttention for a in attentions(model))
    assert all(type(a) is SlicedGroupAttention for a in attentions(default))
    applications = sum(block.recursions for block in model.modules() if hasattr(block, "nlls"))
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    default.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), default(x), rtol=0, atol=0)  # the same weights, the same maths
    assert CountingAttention.calls == applications
    model.train()
    model(x).sum().backward()
    assert all(a.qkv.weight.grad is not None for a in attentions(model))


@pytest.mark.parametrize("name", MODELS)
def test_timm_builds_the_named_attention_layer(name, counting):
    timm = pytest.importorskip("timm")
    import fairseq_sret.vision  # noqa: F401  (registers the models with timm)

    model = timm.create_model(name, attention_layer=counting)
    assert all(type(a) is CountingAttention for a in attentions(model))


@pytest.mark.parametrize("name", MODELS)
def test_the_default_attention_layer_is_todays_model(name):
    named, default = seeded(name, attention_layer="sliced_group"), seeded(name)
    assert list(named.state_dict()) == list(default.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(named.state_dict().values(), default.state_dict().values()))


@pytest.mark.reliability("one-line-errors")
@pytest.mark.parametrize("name", MODELS)
def test_an_unknown_attention_layer_is_a_one_line_error(name):
    with pytest.raises(ValueError) as error:
        create_model(name, attention_layer="no_such_attention")
    message = str(error.value)
    assert message.startswith("attention_layer must be a registered attention layer (")
    assert "sliced_group" in message and "'no_such_attention'" in message and "\n" not in message
