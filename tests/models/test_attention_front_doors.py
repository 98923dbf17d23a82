"""An attention layer registered by name is built through both front doors: fairseq's
``--attention-layer NAME`` (recorded in the checkpoint like any model option) and the
transformers configuration's ``attention_layer``, which the export carries; both models then
compute the same logits. The default builds exactly today's models; an unknown name is one line
naming the option and the registered layers."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("fairseq")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))

from test_modeling import BinTask, fairseq_model, hf_logits, make_data_bin, sret_checkpoint, toy_batch  # noqa: E402

from fairseq_sret.core import SlicedGroupAttention  # noqa: E402
from fairseq_sret.core.attention import ATTENTION_LAYERS, register_attention_layer  # noqa: E402
from fairseq_sret.hf import SReTConfig  # noqa: E402
from fairseq_sret.hf.convert import export_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

NAME = "halved_sliced_group"


class HalvedSlicedGroupAttention(SlicedGroupAttention):
    """The sliced group attention with its output halved: another computation (self- and
    cross-attention, incremental decoding included) under another name."""

    def forward(self, *args, **kwargs):
        return 0.5 * super().forward(*args, **kwargs)


@pytest.fixture(scope="module")
def registered():
    register_attention_layer(NAME)(HalvedSlicedGroupAttention)
    yield NAME
    ATTENTION_LAYERS.unregister(NAME)


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(tmp_path_factory.mktemp("attention_front_doors"))


def attention_types(model):
    return {type(m) for m in model.modules() if isinstance(m, SlicedGroupAttention)}


def test_a_registered_attention_layer_is_built_by_both_front_doors(registered, data_bin, tmp_path):
    task = BinTask(data_bin)
    state = sret_checkpoint(data_bin, tmp_path / "variant.pt", attention_layer=registered, encoder_groups="2,1")
    assert state["cfg"]["model"].attention_layer == registered  # recorded like any model option
    ours = fairseq_model(state, task)
    assert attention_types(ours) == {HalvedSlicedGroupAttention}
    export_checkpoint(tmp_path / "variant.pt", data_bin, tmp_path / "hf")
    from transformers import AutoModelForSeq2SeqLM

    exported = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf").eval()
    assert exported.config.attention_layer == registered
    assert attention_types(exported) == {HalvedSlicedGroupAttention}
    src, lengths, prev = toy_batch(data_bin, task)
    with torch.no_grad():
        expected, _ = ours(src, lengths, prev)
    assert (hf_logits(exported, src, prev) - expected).abs().max() <= 1e-5
    # the name decides the computation: the same weights with the default layer compute otherwise
    default_state = dict(state, cfg=dict(state["cfg"], model=dict_without(state["cfg"]["model"], "attention_layer")))
    default = fairseq_model(default_state, task)
    assert attention_types(default) == {SlicedGroupAttention}
    with torch.no_grad():
        assert (default(src, lengths, prev)[0] - expected).abs().max() > 1e-3


def dict_without(namespace, key):
    import argparse

    return argparse.Namespace(**{k: v for k, v in vars(namespace).items() if k != key})


def test_the_default_is_the_sliced_group_attention(data_bin, tmp_path):
    state = sret_checkpoint(data_bin, tmp_path / "default.pt")
    assert state["cfg"]["model"].attention_layer == "sliced_group"
    assert attention_types(fairseq_model(state, BinTask(data_bin))) == {SlicedGroupAttention}
    assert SReTConfig().attention_layer == "sliced_group"


@pytest.mark.reliability("one-line-errors")
def test_an_unknown_attention_layer_is_one_line_naming_the_option(data_bin, tmp_path):
    with pytest.raises(ValueError, match=r"^--attention-layer 'nope' is not a registered attention layer"
                                         r" \(registered: sliced_group[^\n]*\)$"):
        sret_checkpoint(data_bin, tmp_path / "nope.pt", attention_layer="nope")
    with pytest.raises(ValueError, match=r"^attention_layer 'nope' is not a registered attention layer"
                                         r" \(registered: sliced_group[^\n]*\); register it before loading the model$"):
        SReTConfig(attention_layer="nope")
