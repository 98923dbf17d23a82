"""SReT and recursive MLP-Mixer image models structure, counts, resolutions, timm's model API."""

import re

import pytest
import torch
from torch import nn

from fairseq_sret.core import NonLinearProjection, Recursive, SlicedGroupAttention, SReTBlock
from fairseq_sret.vision import SReT, count_macs, count_params, create_model, list_models
from fairseq_sret.vision.mixer import MixerLayer, RecursiveMixer


pytestmark = pytest.mark.usefixtures("single_thread")


# Official implementation (szq0214/SReT), see ../shared/fixtures/sret_official/README.md.
OFFICIAL_PARAMS = [
    ("sret_t", {}, 4_755_979),
    ("sret_tl", {}, 4_988_024),
    ("sret_s", {}, 20_899_692),
    ("sret_t", {"img_size": 384}, 4_853_259),
    ("sret_t_wo_slice", {}, 4_755_979),
    ("sret_t_distill", {}, 4_755_979),
    ("sret_s_wo_slice_distill", {}, 20_899_692),
]
OFFICIAL_MACS = [
    ("sret_t", {}, 1.112e9),
    ("sret_tl", {}, 1.164e9),
    ("sret_s", {}, 4.173e9),
    ("sret_t_wo_slice", {}, 1.366e9),
    ("sret_tl_wo_slice", {}, 1.418e9),
    ("sret_t_wo_slice", {"img_size": 384}, 6.408e9),
    ("sret_tl", {"groups": ((16, 1), (14, 1), (1, 1))}, 1.225e9),
]


def small_sret(**kw):
    """A 3-stage SReT small enough for fast tests."""
    cfg = dict(embed_dims=(16, 32, 64), num_heads=(2, 2, 4), blocks=(1, 2, 1), img_size=64,
               num_classes=7, mlp_ratio=2.0, drop_path_rate=0.0)
    cfg.update(kw)
    return SReT(**cfg)


@pytest.mark.parametrize("name,kwargs,expected", OFFICIAL_PARAMS)
def test_parameter_counts_equal_official(name, kwargs, expected):
    assert count_params(create_model(name, **kwargs)) == expected


def test_sret_b_parameters_within_one_percent_of_paper():
    with torch.device("meta"):
        model = create_model("sret_b")
    assert abs(count_params(model) - 71.2e6) / 71.2e6 < 0.01


def test_sret_ext_within_three_percent_of_the_papers_counts():
    # the paper's SReT-ExT: 4.0M parameters, 0.7G FLOPs (= MACs); the layout is ours (see sret_ext)
    model = create_model("sret_ext")
    assert count_params(model) == 3_938_017 and abs(count_params(model) - 4.0e6) / 4.0e6 < 0.03
    macs = count_macs(model)
    assert abs(macs - 687_604_480) / 687_604_480 < 1e-3 and abs(macs - 0.7e9) / 0.7e9 < 0.03
    assert [len(s.blocks) for s in model.stages] == [1, 2, 3]
    assert model.cfg.embed_dims == create_model("sret_t").cfg.embed_dims


@pytest.mark.parametrize("name,kwargs,expected", OFFICIAL_MACS)
def test_macs_match_official(name, kwargs, expected):
    # the counting rules are the official ones, so the counts match to 0.1%
    macs = count_macs(create_model(name, **kwargs))
    assert abs(macs - expected) / expected < 1e-3, macs


def test_group_settings_per_stage_and_recursion():
    model = create_model("sret_t")
    expected = [(8, 2), (4, 1), (1, 1)]
    for stage, groups in zip(model.stages, expected):
        for rec in stage.blocks:
            assert isinstance(rec, Recursive) and rec.recursions == 2
            assert isinstance(rec.layer, SReTBlock)
            attn = rec.layer.self_attn
            assert isinstance(attn, SlicedGroupAttention)  # the core module, nothing vision-specific
            assert attn.groups == groups
            assert attn.partition == ("contiguous", "random")
            assert all(isinstance(n, NonLinearProjection) for n in rec.nlls)
    assert [len(s.blocks) for s in model.stages] == [2, 5, 3]
    assert [s.blocks[0].layer.self_attn.num_heads for s in model.stages] == [2, 4, 8]
    no_slice = create_model("sret_t_wo_slice")
    assert all(r.layer.self_attn.groups == (1, 1) for s in no_slice.stages for r in s.blocks)


def test_more_recursions_repeat_the_last_group_and_partition():
    model = small_sret(recursions=3)
    attn = model.stages[0].blocks[0].layer.self_attn
    assert attn.groups == (8, 2, 2) and attn.partition == ("contiguous", "random", "random")
    assert len(model.stages[0].blocks[0].nlls) == 3
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 7)


def test_official_drop_path_schedule():
    model = create_model("sret_t")  # rate 0.1 over 20 applications, as the official code
    rates = [r.layer.drop_path.p for s in model.stages for r in s.blocks]
    assert rates == pytest.approx([0.0, 0.005, 0.02, 0.025, 0.03, 0.035, 0.04, 0.07, 0.075, 0.08])


def test_shape_stem_pooling_and_head():
    model = small_sret().eval()
    x = torch.randn(2, 3, 64, 64)
    feats = model.forward_features(x)
    assert feats.shape == (2, 64, 2, 2)
    pre = model.forward_head(feats, pre_logits=True)
    assert pre.shape == (2, 64)
    ref = model.norm(feats.mean(dim=(2, 3)))
    assert torch.allclose(pre, ref)
    assert torch.allclose(model(x), model.head(ref), atol=1e-6)
    assert model.stem(x).shape == (2, 16, 8, 8)
    assert model.pools[0].conv.groups == 16 and model.pools[0].conv.stride == (2, 2)


def test_eval_stem_folds_batch_norm_into_the_convolution():
    from fairseq_sret.vision.sret import ConvBNReLU

    torch.manual_seed(0)
    layer = ConvBNReLU(3, 8)
    layer.train()
    for _ in range(3):  # running statistics away from their initial 0 / 1
        layer(torch.randn(4, 3, 16, 16) * 2 + 1)
    with torch.no_grad():
        layer.norm.weight.uniform_(-2, 2)
        layer.norm.bias.uniform_(-1, 1)
    layer.eval()
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    calls = []
    hook = layer.norm.register_forward_hook(lambda *_: calls.append(1))
    reference = layer(x)  # a hook keeps conv, BatchNorm and ReLU as three calls
    hook.remove()
    assert calls == [1]
    reference_grads = torch.autograd.grad(reference.square().sum(), [x, layer.conv.weight, layer.norm.weight])
    folded = layer(x)
    torch.testing.assert_close(folded, reference, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(folded.square().sum(), [x, layer.conv.weight, layer.norm.weight])
    for got, want in zip(grads, reference_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    running = layer.norm.running_mean.clone()
    layer(x)
    assert torch.equal(layer.norm.running_mean, running)  # eval: statistics untouched


def test_recursion_reuses_the_shared_block_with_recursion_index():
    model = small_sret().eval()
    rec = model.stages[0].blocks[0]
    seen = []
    orig = rec.layer.self_attn.forward

    def spy(x, *args, recursion=0, **kwargs):
        seen.append((int(recursion), rec.layer.self_attn.groups_at(recursion)))
        return orig(x, *args, recursion=recursion, **kwargs)

    rec.layer.self_attn.forward = spy
    model(torch.randn(1, 3, 64, 64))
    assert seen == [(0, 8), (1, 2)]


def test_training_uses_random_partition_and_eval_is_deterministic():
    model = small_sret(groups=((1, 4), (1, 1), (1, 1)))
    x = torch.randn(2, 3, 64, 64)
    model.eval()
    assert torch.equal(model(x), model(x))
    model.train()  # no dropout / drop path: only the random partition differs
    torch.manual_seed(0)
    a = model(x)
    torch.manual_seed(1)
    b = model(x)
    assert not torch.allclose(a, b)


def test_any_resolution_divisible_by_32():
    for size in [(96, 96), (64, 128)]:
        model = small_sret(img_size=size).eval()
        assert model.pos_embed.shape == (1, 16, size[0] // 8, size[1] // 8)
        assert model(torch.randn(1, 3, *size)).shape == (1, 7)
    with pytest.raises(ValueError, match="multiple of 32"):
        small_sret(img_size=80)
    model = small_sret()
    with pytest.raises(ValueError, match="divisible by 32"):
        model(torch.randn(1, 3, 72, 72))
    with pytest.raises(ValueError, match=r"expected input \(B, 3, H, W\)"):
        model(torch.randn(1, 1, 64, 64))
    assert model(torch.randn(1, 3, 96, 128)).shape == (1, 7)  # position embedding interpolated
    with pytest.raises(ValueError, match="built for 64x64 with dynamic_img_size=False"):
        small_sret(dynamic_img_size=False)(torch.randn(1, 3, 96, 96))


def test_dynamic_img_size_interpolates_position_embedding():
    torch.manual_seed(0)
    model = small_sret().eval()  # dynamic_img_size=True by default
    big = small_sret(img_size=96).eval()
    state = model.state_dict()
    state["pos_embed"] = nn.functional.interpolate(model.pos_embed, size=(12, 12), mode="bicubic", align_corners=False)
    big.load_state_dict(state)
    x = torch.randn(1, 3, 96, 96)
    assert torch.allclose(model(x), big(x), atol=1e-5)


def test_config_errors():
    with pytest.raises(ValueError, match="stages"):
        small_sret(num_heads=(2, 2))
    with pytest.raises(ValueError, match="group counts"):
        small_sret(groups=((8, 2, 1), (1, 1), (1, 1)))
    with pytest.raises(ValueError, match="modes"):
        small_sret(partition=("contiguous", "random", "strided"))
    with pytest.raises(ValueError, match="integer factors"):
        small_sret(embed_dims=(16, 24, 48), num_heads=(2, 2, 2))
    with pytest.raises(TypeError):
        small_sret(no_such_option=1)


def test_timm_conventions():
    model = small_sret()
    assert model.no_weight_decay() == {"pos_embed"}
    model.reset_classifier(3)
    assert model.get_classifier().out_features == 3
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)
    model.reset_classifier(0)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 64)
    with pytest.raises(ValueError, match="global_pool must be one of"):
        model.reset_classifier(3, global_pool="catavgmax")
    with pytest.raises(ValueError, match="global_pool must be one of"):
        small_sret(global_pool="token")


def test_gradient_checkpointing_gives_same_gradients():
    torch.manual_seed(0)
    model = small_sret(groups=((2, 2), (1, 1), (1, 1)))
    x = torch.randn(2, 3, 64, 64)
    torch.manual_seed(1)  # same random partition in both runs
    model(x).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    torch.manual_seed(1)
    model(x).sum().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[n], atol=1e-5), n


def test_lrc_switch_removes_coefficients():
    with_lrc, without = small_sret(), small_sret(lrc=False)
    # per shared block 4 scalars, per NLL 2 scalars: 4 blocks x (4 + 2 x 2)
    assert count_params(with_lrc) - count_params(without) == 4 * 8


def test_registry_lists_paper_models():
    names = list_models()
    for name in ["sret_ext", "sret_t", "sret_tl", "sret_s", "sret_b", "sret_t_wo_slice", "sret_tl_wo_slice",
                 "sret_s_wo_slice", "sret_t_distill", "sret_tl_distill", "sret_s_distill",
                 "sret_t_distill_384", "sret_s_wo_slice_distill_512", "recursive_mixer_b16"]:
        assert name in names
    assert list_models("sret_t_*384") == ["sret_t_distill_384", "sret_t_wo_slice_distill_384"]
    assert create_model("sret_t_distill_384", num_classes=0).cfg.img_size == (384, 384)
    with pytest.raises(ValueError, match="unknown model"):
        create_model("sret_xxl")
    with pytest.raises(ValueError, match="checkpoint_path"):
        create_model("sret_t", pretrained=True)


# --------------------------------------------------------------------------- MLP-Mixer
def test_mixer_b16_parameter_counts():
    with torch.device("meta"):
        base = create_model("mixer_b16")
        rec = create_model("recursive_mixer_b16")
    assert count_params(base) == 59_880_472  # Mixer-B/16 (Tolstikhin et al.)
    assert count_params(rec) == 59_880_472 + 12 * 4  # + LRC: 4 scalars per shared layer
    layer = rec.blocks[0].layer
    assert rec.cfg.layers == 12 and rec.blocks[0].recursions == 2 and rec.blocks[0].nlls is None
    assert layer.token_mlp.fc1.out_features == 384 and layer.channel_mlp.fc1.out_features == 3072
    assert layer.token_mlp.fc1.in_features == 196


def test_recursive_mixer_applies_each_layer_twice():
    torch.manual_seed(0)
    model = RecursiveMixer(img_size=32, patch_size=8, embed_dim=24, layers=2, token_mlp_dim=8,
                           channel_mlp_dim=48, num_classes=5).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() == 1:
                p.uniform_(0.5, 1.5)  # LRC scalars away from 1 so they matter
    x = torch.randn(2, 3, 32, 32)

    def layer_ref(m: MixerLayer, z):
        t = m.token_norm(z).transpose(1, 2)
        t = m.token_mlp.fc2(nn.functional.gelu(m.token_mlp.fc1(t))).transpose(1, 2)
        z = m.token_residual.skip_scale * z + m.token_residual.branch_scale * t
        c = m.channel_mlp.fc2(nn.functional.gelu(m.channel_mlp.fc1(m.channel_norm(z))))
        return m.channel_residual.skip_scale * z + m.channel_residual.branch_scale * c

    z = model.stem(x).flatten(2).transpose(1, 2)
    for rec in model.blocks:
        z = layer_ref(rec.layer, layer_ref(rec.layer, z))
    ref = model.head(model.norm(z).mean(dim=1))
    assert torch.allclose(model(x), ref, atol=1e-5)
    with pytest.raises(ValueError, match="fixes the resolution"):
        model(torch.randn(1, 3, 64, 64))


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_classes=-5), "num_classes must be >= 0"), (dict(img_size=0), r"img_size \(0, 0\) must be a positive multiple"),
    (dict(img_size=-32), "must be a positive multiple")])
def test_a_model_of_nonsense_sizes_is_refused_at_build(kwargs, message):
    with pytest.raises(ValueError, match=message):
        small_sret(**kwargs)
    mixer = {"num_classes": "num_classes must be >= 0"}.get(next(iter(kwargs)), "must be a positive multiple")
    with pytest.raises(ValueError, match=mixer):
        RecursiveMixer(img_size=kwargs.get("img_size", 32), patch_size=16, embed_dim=8, layers=1, token_mlp_dim=8,
                       channel_mlp_dim=8, num_classes=kwargs.get("num_classes", 2))
    small_sret(num_classes=0)  # timm's convention: no classifier


# --------------------------------------------------------------------------- timm's model API
def small_mixer(**kw):
    cfg = dict(img_size=32, patch_size=8, embed_dim=24, layers=3, token_mlp_dim=8, channel_mlp_dim=48, num_classes=5)
    cfg.update(kw)
    return RecursiveMixer(**cfg)


def test_forward_intermediates_are_the_stage_outputs():
    torch.manual_seed(0)
    model = small_sret().eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        final, taps = model.forward_intermediates(x)
        assert torch.equal(final, model.forward_features(x))
        assert [tuple(t.shape) for t in taps] == [(2, 16, 8, 8), (2, 32, 4, 4), (2, 64, 2, 2)]
        by_hand = model.stages[0](model._stem_forward(x))
        assert torch.equal(taps[0], by_hand)
        assert torch.equal(taps[1], model.stages[1](model.pools[0](by_hand)))
        early, (first,) = model.forward_intermediates(x, indices=[0], stop_early=True)
        assert torch.equal(early, taps[0]) and torch.equal(first, taps[0])
        (last,) = model.forward_intermediates(x, indices=1, norm=True, output_fmt="NHWC", intermediates_only=True)
        assert torch.equal(last, model.norm(taps[2].permute(0, 2, 3, 1)))
        assert [t.shape[1] for t in model.forward_intermediates(x, indices=[-3, -1], intermediates_only=True)] == [16, 64]
    assert [f["reduction"] for f in model.feature_info] == [8, 16, 32]
    with pytest.raises(ValueError, match="intermediate indices"):
        model.forward_intermediates(x, indices=[3])
    with pytest.raises(ValueError, match="output_fmt"):
        model.forward_intermediates(x, output_fmt="NLC")


def test_prune_intermediate_layers_ends_the_features_at_the_last_tap():
    torch.manual_seed(0)
    model = small_sret().eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        taps = model.forward_intermediates(x, intermediates_only=True)
        assert model.prune_intermediate_layers([-2]) == [1]
        assert len(model.stages) == 2 and len(model.pools) == 1
        assert isinstance(model.norm, nn.Identity) and isinstance(model.head, nn.Identity)
        assert model.num_features == model.head_hidden_size == 32
        assert torch.equal(model.forward_features(x), taps[1])
        model.reset_classifier(4, "avg")
        assert torch.equal(model.forward_head(model.forward_features(x), pre_logits=True), taps[1].mean(dim=(2, 3)))
        assert model(x).shape == (2, 4)


def test_global_pool_options():
    torch.manual_seed(0)
    model = small_sret(global_pool="").eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        features = model.forward_features(x)
        per_position = model(x)  # the LayerNorm and the head at every position
        assert per_position.shape == (2, 7, 2, 2)
        assert torch.allclose(per_position, model.head(model.norm(features.permute(0, 2, 3, 1))).permute(0, 3, 1, 2))
        model.reset_classifier(0, "max")
        assert torch.equal(model(x), model.norm(features.amax(dim=(2, 3))))
        model.reset_classifier(0, "avgmax")
        assert torch.allclose(model(x), model.norm(0.5 * (features.mean(dim=(2, 3)) + features.amax(dim=(2, 3)))))
        model.reset_classifier(3)  # None keeps the pooling
        assert model.global_pool == "avgmax" and model(x).shape == (2, 3)
        mixer = small_mixer(global_pool="").eval()
        assert mixer(torch.randn(2, 3, 32, 32)).shape == (2, 16, 5)


def test_device_and_dtype_at_construction_and_in_a_new_head():
    model = small_sret(device="meta", dtype=torch.float64)
    assert {(p.device.type, p.dtype) for p in model.parameters()} == {("meta", torch.float64)}
    assert all(b.device.type == "meta" for b in model.buffers())
    model.eval()
    model.reset_classifier(3)
    assert (model.head.weight.device.type, model.head.weight.dtype, model.head.training) == ("meta", torch.float64, False)
    mixer = small_mixer(device="meta", dtype=torch.bfloat16)
    assert {(p.device.type, p.dtype) for p in mixer.parameters()} == {("meta", torch.bfloat16)}


def test_group_matcher_patterns():
    model = small_sret()
    matcher = model.group_matcher()
    stem, blocks = re.compile(matcher["stem"]), matcher["blocks"]
    assert stem.match("stem.0.conv.weight") and stem.match("pos_embed")
    block = re.compile(blocks[0][0])
    assert block.match("stages.1.blocks.0.nlls.1.mlp.fc1.weight").groups() == ("1", "0")
    assert re.compile(blocks[1][0]).match("pools.0.conv.weight").groups() == ("0",)
    assert re.compile(model.group_matcher(coarse=True)["blocks"]).match("pools.1.conv.bias").groups() == ("1",)


@pytest.mark.parametrize("build", [lambda: small_sret(groups=((2, 2), (1, 1), (1, 1)), drop_path_rate=0.1),
                                   lambda: small_mixer(drop_path_rate=0.1)])
def test_fx_graph_runs_the_same_code_as_eager(build, monkeypatch):
    torch.manual_seed(0)
    model = build().eval()
    x = torch.randn(2, 3, *model.cfg.img_size)
    graph = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        assert torch.equal(graph(x), model(x))
    model.train()  # random partitions, drop path: the same draws with the same seed
    graph = torch.fx.symbolic_trace(model)
    torch.manual_seed(1)
    expected = model(x)
    torch.manual_seed(1)
    got = graph(x)
    assert torch.equal(got, expected)
    got.sum().backward()
    assert all(p.grad is not None for p in graph.parameters())
    # the graph decides at run time what eager mode decides: checks, oneDNN's linear
    from fairseq_sret.core import linear

    decided = []
    original = linear._use_onednn
    monkeypatch.setattr(linear, "_use_onednn", lambda *a: decided.append(1) or original(*a))
    graph.eval()
    with torch.no_grad():
        graph(x)
    assert decided
    with pytest.raises(ValueError, match="expected input"):
        graph(torch.randn(1, 1, *model.cfg.img_size))
