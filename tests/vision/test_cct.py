"""Compact Convolutional Transformers (CCT) and the recursive CCT: counts against the paper,
the layer against its equations, recursion, depth, timm's model API, training steps."""

import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_sret.core import SReTBlock, fold_lrc
from fairseq_sret.vision import count_macs, count_params, create_model, list_models
from fairseq_sret.vision.cct import CCT

pytestmark = pytest.mark.usefixtures("single_thread")

CCT_MODELS = ("cct_2_3x2_32", "cct_4_3x2_32", "sret_cct_2_3x2_32")
# Published CIFAR-10 counts (Hassani et al., arXiv:2104.05704, Table 1; 32x32 input):
# (model, parameters, MACs in G).
PUBLISHED = [("cct_2_3x2_32", 0.284e6, 0.033e9), ("cct_4_3x2_32", 0.482e6, 0.046e9)]
# The same models built by the authors' code (SHI-Labs/Compact-Transformers, src/cct.py
# cct_2_3x2_32 / cct_4_3x2_32), parameters counted with sum(p.numel()).
REFERENCE_PARAMS = {"cct_2_3x2_32": 283_723, "cct_4_3x2_32": 482_123}
TOKENS, WIDTH = 64, 128  # 8x8 tokens of width 128 at 32x32 pixels


def images(n=4, size=32, seed=0):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- counts
@pytest.mark.parametrize("name,params,_", PUBLISHED)
def test_parameters_match_the_published_counts(name, params, _):
    count = count_params(create_model(name))
    assert count == REFERENCE_PARAMS[name]
    assert abs(count - params) / params < 0.01


def _attention_macs(macs_by_op: dict) -> int:
    return sum(v for op, v in macs_by_op.items() if "scaled_dot_product" in op)


@pytest.mark.parametrize("name,_,macs", PUBLISHED)
def test_macs_match_the_published_counts_without_the_attention_products(name, _, macs):
    """The published MACs leave out the attention's two matrix products (q k^T, attn v),
    which our counter includes (the convention of the SReT numbers): without them ours are
    within the rounding of the published three decimals (2%)."""
    model = create_model(name)
    by_op = count_macs(model, by_operator=True)
    layers = model.cfg.layers
    assert _attention_macs(by_op) == layers * 2 * TOKENS * TOKENS * WIDTH
    total = count_macs(model)
    assert total == sum(by_op.values())
    assert abs(total - _attention_macs(by_op) - macs) / macs < 0.02


def test_sliced_attention_costs_a_share_of_the_attention_products():
    """Four groups in the first application: a quarter of its attention products. The
    per-stage form of sret-count's --groups (one stage) is the same setting."""
    by_op = count_macs(create_model("sret_cct_2_3x2_32", groups=(4, 1)), by_operator=True)
    assert _attention_macs(by_op) == 2 * (1 / 4 + 1) * 2 * TOKENS * TOKENS * WIDTH
    assert create_model("sret_cct_2_3x2_32", groups=((4, 1),)).cfg.groups == (4, 1)


def test_recursive_cct_counts_follow_its_layout():
    """Two unique layers applied twice: CCT-2's parameters plus four NLLs and the LRC
    coefficients, CCT-4's layer applications (MACs) plus the NLLs'."""
    plain, recursive = create_model("cct_2_3x2_32"), create_model("sret_cct_2_3x2_32")
    nll = 2 * WIDTH + 2 * (WIDTH * WIDTH + WIDTH)  # LayerNorm + two linears (ratio 1)
    lrc = 2 * 2 + 2 * 2  # per unique layer: two residuals and two NLLs, two coefficients each
    assert count_params(recursive) == count_params(plain) + 4 * nll + 2 * lrc
    nll_macs = 2 * TOKENS * WIDTH * WIDTH
    assert count_macs(recursive) == count_macs(create_model("cct_4_3x2_32")) + 4 * nll_macs


# --------------------------------------------------------------------------- the layer
def _reference_layer(x, block, skip=(1.0, 1.0), branch=(1.0, 1.0)):
    """The CCT layer from the paper's equations, written with plain tensor operations:
    x = s0 x + b0 MHSA(LN0(x)); x = LN1(x); x = s1 x + b1 MLP(x), MLP = fc2(GELU(fc1(.)))
    (s = b = 1 without LRC). MHSA: q, k, v = LN0(x) W_qkv (no bias), heads of width d,
    softmax(q k^T / sqrt(d)) v, then the output projection."""
    attn, heads = block.self_attn, block.self_attn.num_heads
    ln0, ln1, ffn = block.self_attn_norm, block.ffn_norm, block.ffn
    b, n, c = x.shape
    d = c // heads
    h = F.layer_norm(x, (c,), ln0.weight, ln0.bias, ln0.eps)
    q, k, v = (h @ attn.qkv.weight.T).split(c, dim=-1)
    q, k, v = (t.reshape(b, n, heads, d).transpose(1, 2) for t in (q, k, v))
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1) @ v
    a = a.transpose(1, 2).reshape(b, n, c) @ attn.out_proj.weight.T + attn.out_proj.bias
    x = skip[0] * x + branch[0] * a
    x = F.layer_norm(x, (c,), ln1.weight, ln1.bias, ln1.eps)
    mlp = F.gelu(x @ ffn.fc1.weight.T + ffn.fc1.bias) @ ffn.fc2.weight.T + ffn.fc2.bias
    return skip[1] * x + branch[1] * mlp


def test_the_layer_is_cct_s_layer():
    model = create_model("cct_2_3x2_32").double().eval()
    block = model.blocks[0].layer
    assert isinstance(block, SReTBlock) and block.self_attn.qkv.bias is None
    with torch.no_grad():
        for p in block.parameters():  # away from the identity LayerNorms and zero biases
            p.add_(0.1 * torch.randn_like(p))
        x = torch.randn(3, TOKENS, WIDTH, dtype=torch.float64)
        torch.testing.assert_close(model.blocks[0](x), _reference_layer(x, block), rtol=1e-10, atol=1e-10)


def test_the_recursive_layer_applies_lrc_to_the_normalised_stream():
    """With LRC, the FFN's skip coefficient scales the normalised stream; one application of
    the shared layer, then its NLL: z = NLL_1(F(z))."""
    model = create_model("sret_cct_2_3x2_32").double().eval()
    layer = model.blocks[0]
    block, nll = layer.layer, layer.nlls[0]
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.2 * torch.randn_like(p))
        x = torch.randn(2, TOKENS, WIDTH, dtype=torch.float64)
        model.set_depth(1)
        res = (block.self_attn_residual, block.ffn_residual)
        f = _reference_layer(x, block, [r.skip_scale for r in res], [r.branch_scale for r in res])
        expected = nll.residual.skip_scale * f + nll.residual.branch_scale * nll.mlp(nll.norm(f))
        torch.testing.assert_close(layer(x), expected, rtol=1e-10, atol=1e-10)


def test_chained_layernorms_compute_the_same_layer():
    """The path that computes each residual together with the next LayerNorm (the fused kernel's
    on CUDA; here its PyTorch fallback) gives the FFN the normalised stream as its skip too."""
    layer = create_model("sret_cct_2_3x2_32").double().eval().blocks[0]
    x = torch.randn(2, TOKENS, WIDTH, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer._forward_chained(x, None, (), {}), layer(x), rtol=1e-12, atol=1e-12)


def test_normalising_the_stream_is_a_pre_ln_option():
    with pytest.raises(ValueError, match="pre-LN"):
        SReTBlock(16, 2, 16, normalize_before=False, normalize_stream_before_ffn=True)


def test_sequence_pooling_is_an_attention_pooling_over_tokens():
    model = create_model("cct_2_3x2_32").eval()
    features = model.forward_features(images(2))
    tokens = features.flatten(2).transpose(1, 2)
    scores = tokens @ model.seq_pool.attention.weight.T + model.seq_pool.attention.bias  # (B, N, 1)
    pooled = (torch.softmax(scores, dim=1) * tokens).sum(dim=1)
    torch.testing.assert_close(model.forward_head(features, pre_logits=True), pooled)
    torch.testing.assert_close(model(images(2)), model.head(pooled))


# --------------------------------------------------------------------------- recursion
def test_one_recursion_without_nll_and_lrc_is_the_plain_cct():
    plain = create_model("cct_2_3x2_32").eval()
    recursive = create_model("sret_cct_2_3x2_32", recursions=1, nll_ratio=0, lrc=False).eval()
    assert set(recursive.state_dict()) == set(plain.state_dict())
    recursive.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert torch.equal(recursive(images()), plain(images()))


def test_set_depth_one_runs_the_first_application_and_its_nll():
    torch.manual_seed(0)
    deep = create_model("sret_cct_2_3x2_32").eval()
    shallow = create_model("sret_cct_2_3x2_32", recursions=1).eval()
    shallow.load_state_dict({k: v for k, v in deep.state_dict().items() if ".nlls.1." not in k})
    x = images()
    with torch.no_grad():
        full = deep(x)
        assert deep.recursions == 2 and deep.depth == 2
        deep.set_depth(1)
        assert deep.depth == 1
        torch.testing.assert_close(deep(x), shallow(x), rtol=0, atol=0)
        assert not torch.allclose(deep(x), full)
        deep.set_depth(None)
        torch.testing.assert_close(deep(x), full, rtol=0, atol=0)
    with pytest.raises(ValueError):
        deep.set_depth(3)


def test_plain_recursion_has_no_nll_and_no_lrc():
    model = create_model("sret_cct_2_3x2_32", nll_ratio=0, lrc=False)
    assert all(layer.nlls is None and layer.recursions == 2 for layer in model.blocks)
    assert not any(name.endswith(("skip_scale", "branch_scale")) for name, _ in model.named_parameters())
    assert count_params(model) == count_params(create_model("cct_2_3x2_32"))


def test_drop_path_rates_are_spaced_over_the_applications():
    rates = lambda name: [layer.layer.drop_path.p for layer in create_model(name).blocks]  # noqa: E731
    assert rates("cct_4_3x2_32") == pytest.approx([0.0, 0.1 / 3, 0.2 / 3, 0.1])  # CCT's linspace(0, 0.1, 4)
    assert rates("sret_cct_2_3x2_32") == pytest.approx([0.0, 0.2 / 3])  # first applications 0 and 2 of 4


def test_fold_lrc_keeps_the_logits():
    from test_fold import randomize_lrc

    model = create_model("sret_cct_2_3x2_32").double().eval()
    randomize_lrc(model, seed=2)
    folded = fold_lrc(model)
    assert not any(name.endswith("skip_scale") for name, _ in folded.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(folded(images().double()), model(images().double()), rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- shapes and API
@pytest.mark.parametrize("name", CCT_MODELS)
def test_shapes_and_timm_conventions(name):
    model = create_model(name).eval()
    x = images(2)
    with torch.no_grad():
        features = model.forward_features(x)
        assert features.shape == (2, WIDTH, 8, 8)
        assert model.forward_head(features, pre_logits=True).shape == (2, WIDTH)
        assert model(x).shape == (2, 10)
        assert model(images(2, size=64)).shape == (2, 10)  # position embedding interpolated
        final, taps = model.forward_intermediates(x)
        torch.testing.assert_close(final, features, rtol=0, atol=0)
        assert [t.shape[1:] for t in taps] == [(64, 16, 16)] + [(WIDTH, 8, 8)] * (1 + model.cfg.layers)
        model.reset_classifier(0, "")
        assert model.seq_pool is None and model(x).shape == (2, WIDTH, 8, 8)
        model.reset_classifier(5, "seq")
        assert model(x).shape == (2, 5)
    assert model.no_weight_decay() == {"pos_embed"}
    assert model.pretrained_cfg["input_size"] == (3, 32, 32) and model.pretrained_cfg["num_classes"] == 10


def test_pruned_to_the_tokenizer_the_model_ends_there():
    model = create_model("cct_2_3x2_32").eval()
    x = images(2)
    with torch.no_grad():
        taps = model.forward_intermediates(x, intermediates_only=True)
        assert model.prune_intermediate_layers([1]) == [1]
        assert model.pos_embed is None and len(model.blocks) == 0 and model.num_features == WIDTH
        torch.testing.assert_close(model.forward_features(x), taps[1], rtol=0, atol=0)
        assert model(x).shape == (2, WIDTH, 8, 8)


@pytest.mark.parametrize("kwargs", [
    dict(img_size=30), dict(global_pool="token"), dict(num_heads=3), dict(nll="yes"), dict(nll_ratio=-1.0),
    dict(groups=(1, 1, 1)), dict(recursions=2, groups=((4, 1), (2, 1))), dict(kernel_size=4),
    dict(attention_layer="no_such_attention"),
])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        CCT(**kwargs)


def test_bad_input_is_refused():
    model = create_model("cct_2_3x2_32")
    with pytest.raises(ValueError, match="expected input"):
        model(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match="divisible by 4"):
        model(torch.randn(1, 3, 30, 30))


def test_registered_as_vision_and_timm_models():
    assert set(CCT_MODELS) <= set(list_models("*cct*"))
    timm = pytest.importorskip("timm")
    model = timm.create_model("sret_cct_2_3x2_32", nll_ratio=0, lrc=False)
    assert isinstance(model, CCT) and model.cfg.nll_ratio == 0
    assert model.pretrained_cfg["first_conv"] == "tokenizer.0.conv"
    backbone = timm.create_model("cct_2_3x2_32", features_only=True)
    assert [f.shape[1] for f in backbone(images(1))] == [WIDTH] * 3


def test_a_checkpoint_loads_at_another_resolution(tmp_path):
    """The position embedding is interpolated to the model's grid, as for SReT."""
    from fairseq_sret.vision import save_checkpoint

    save_checkpoint(create_model("sret_cct_2_3x2_32"), tmp_path / "cct.pt")
    model = create_model("sret_cct_2_3x2_32", img_size=64, checkpoint_path=str(tmp_path / "cct.pt"))
    assert model.pos_embed.shape == (1, WIDTH, 16, 16)


# --------------------------------------------------------------------------- training
@pytest.mark.parametrize("name", ["cct_2_3x2_32", "sret_cct_2_3x2_32"])
def test_a_few_optimizer_steps_lower_the_loss(name):
    torch.manual_seed(0)
    model = create_model(name, num_classes=2, drop_path_rate=0.0, attn_drop_rate=0.0)
    # two classes of generated images: bright top half or bright bottom half
    x = 0.3 * images(16)
    labels = torch.arange(16) % 2
    x[labels == 0, :, :16] += 1.0
    x[labels == 1, :, 16:] += 1.0
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(10):
        loss = F.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
