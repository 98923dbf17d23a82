"""fairseq_sret.core.linear: oneDNN's linear (bias and activation in the product) computes
``act(layer(x))``; it is used only where it may be (no gradient, no autocast, eager, no hooks)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_sret.core import FeedForward, SlicedGroupAttention, fast_paths
from fairseq_sret.core.linear import (FUSABLE_ACTIVATIONS, ONEDNN_MIN_ROWS, linear, onednn_bf16_available,
                                      onednn_linear_available)
from fairseq_sret.vision import create_model
from fairseq_sret.vision.sret import _add_pos_embed

pytestmark = pytest.mark.usefixtures("single_thread")
onednn = pytest.mark.skipif(not onednn_linear_available(), reason="no oneDNN linear in this torch build")
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
REFERENCE = {None: lambda y: y, "relu": F.relu, "gelu": F.gelu, "gelu_accurate": lambda y: F.gelu(y, approximate="tanh")}


@onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", [None, *FUSABLE_ACTIVATIONS])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_equals_the_layer_and_its_activation(dtype, activation, bias):
    torch.manual_seed(0)
    layer = nn.Linear(24, 40, bias=bias).to(dtype)
    x = torch.randn(3, ONEDNN_MIN_ROWS // 3 + 1, 24, dtype=dtype)
    with torch.no_grad(), torch.profiler.profile() as profile:
        got = linear(x, layer, activation)
    # oneDNN's, unless a bf16 input meets a processor where oneDNN cannot run bf16
    expect_onednn = dtype == torch.float32 or onednn_bf16_available()
    assert any("_linear_pointwise" in event.key for event in profile.key_averages()) == expect_onednn
    with torch.no_grad():
        want = REFERENCE[activation](layer(x).float()).to(dtype)
        with fast_paths(onednn_linear=False):
            assert torch.equal(linear(x, layer, activation), REFERENCE[activation](layer(x)))
    assert got.dtype == dtype and got.shape == (*x.shape[:-1], 40)
    torch.testing.assert_close(got, want, **TOLERANCE[dtype])


def test_linear_keeps_gradients_autocast_and_hooks():
    torch.manual_seed(0)
    layer = nn.Linear(8, 8)
    x = torch.randn(2, 8, requires_grad=True)
    out = linear(x, layer, "gelu")
    out.sum().backward()  # the reference path under autograd
    assert x.grad is not None and layer.weight.grad is not None
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(x, layer).dtype == torch.bfloat16  # autocast's linear, not oneDNN's fp32 one
    seen = []
    layer.register_forward_hook(lambda *_: seen.append(True))
    with torch.no_grad():
        linear(x, layer)
    assert seen == [True]
    with pytest.raises(ValueError, match="fuses"):
        linear(x, layer, "silu")


@onednn
@pytest.mark.parametrize("activation", ["gelu", "relu", "silu"])
def test_feedforward_and_attention_at_inference_equal_the_reference_path(activation):
    torch.manual_seed(0)
    ffn = FeedForward(32, 48, activation).eval()
    attn = SlicedGroupAttention(32, 4, groups=(4,)).eval()
    x = torch.randn(2, ONEDNN_MIN_ROWS // 2, 32)
    with torch.no_grad():
        fast = ffn(x), attn(x)
        with fast_paths(onednn_linear=False):
            reference = ffn(x), attn(x)
    for a, b in zip(fast, reference):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@onednn
def test_vision_model_inference_equals_the_reference_path():
    torch.manual_seed(0)
    model = create_model("sret_t", img_size=128, num_classes=10).eval()
    x = torch.randn(8, 3, 128, 128)  # 2,048 first-stage tokens: the oneDNN path
    with torch.no_grad():
        fast = model(x)
        with fast_paths(onednn_linear=False):
            reference = model(x)
            # the stem and stages on the NCHW input, as forward_features ran them on every device
            h = model.pos_drop(_add_pos_embed(model.stem(x), model.pos_embed, False, model.cfg.img_size))
            for s, stage in enumerate(model.stages):
                h = stage(model.pools[s - 1](h) if s > 0 else h)
            nchw = model.forward_head(h)
    torch.testing.assert_close(fast, reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(nchw, reference, rtol=1e-4, atol=1e-4)


def test_a_quantized_layer_runs_its_own_product():
    """A layer whose weight int8 quantization replaced (core.int8) keeps its quantized forward
    on inputs long enough for oneDNN, which would read the weight as a plain matrix."""
    pytest.importorskip("torchao")
    from fairseq_sret.core.int8 import is_int8, quantize_int8_

    torch.manual_seed(0)
    model = quantize_int8_(nn.Sequential(nn.Linear(16, 32)))
    layer = model[0]
    assert is_int8(layer)
    x = torch.randn(ONEDNN_MIN_ROWS + 1, 16)
    with torch.no_grad():
        assert torch.equal(linear(x, layer, "relu"), F.relu(layer(x)))


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_quantized_cross_attention_projects_in_every_mode(mode):
    """Cross-attention reads the queries' and the keys' rows of its joint projection apart; a
    quantized weight is not sliced (torchao's cannot be under inference_mode): the same
    function as the quantized layer's own product."""
    pytest.importorskip("torchao")
    from fairseq_sret.core.int8 import quantize_int8_

    torch.manual_seed(0)
    attention = SlicedGroupAttention(32, 4, cross_attention=True).eval()
    quantize_int8_(attention)
    x, memory = torch.randn(2, 3, 32), torch.randn(2, 5, 32)
    with mode():
        q = attention._project_q(x)
        k, v = attention._project_kv(memory)
        out = attention(x, memory)
        projected = attention.qkv(torch.cat([x, memory], dim=1))
    assert torch.equal(q, attention._split_heads(projected[:, :3, :32]))
    assert torch.equal(k, attention._split_heads(projected[:, 3:, 32:64]))
    assert torch.equal(v, attention._split_heads(projected[:, 3:, 64:]))
    assert out.shape == x.shape and torch.isfinite(out).all()


def test_quantizing_twice_changes_nothing():
    pytest.importorskip("torchao")
    from fairseq_sret.core.int8 import quantize_int8_

    torch.manual_seed(0)
    model = quantize_int8_(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)))
    x = torch.randn(5, 16)
    with torch.no_grad():
        once = model(x)
        assert torch.equal(quantize_int8_(model)(x), once)
