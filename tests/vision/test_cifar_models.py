"""The CIFAR-scale models: each rung of the paper's ablation ladder changes one thing."""

import pytest
import torch

from fairseq_sret.vision import count_macs, count_params, create_model

pytestmark = pytest.mark.usefixtures("single_thread")

PLAIN_ONCE = dict(recursions=1, nll_ratio=0, lrc=False, groups=((1,), (1,), (1,)), partition=("contiguous",))


def test_the_baseline_is_sret_with_one_recursion_and_the_extras_off():
    torch.manual_seed(0)
    baseline = create_model("sret_cifar_baseline").eval()
    sret = create_model("sret_cifar", **PLAIN_ONCE).eval()
    assert {k: v.shape for k, v in baseline.state_dict().items()} == {k: v.shape for k, v in sret.state_dict().items()}
    sret.load_state_dict(baseline.state_dict())
    x = torch.randn(3, 3, 32, 32)
    assert torch.equal(baseline(x), sret(x))
    assert not any("nll" in name or "scale" in name for name in baseline.state_dict())


def test_each_rung_changes_one_thing():
    baseline = create_model("sret_cifar_baseline")
    deep = create_model("sret_cifar_baseline_deep")
    recursion = create_model("sret_cifar_wo_slice", nll_ratio=0, lrc=False)
    with_nll = create_model("sret_cifar_wo_slice", lrc=False)
    with_lrc = create_model("sret_cifar_wo_slice")
    sret = create_model("sret_cifar")
    # recursion re-applies the baseline's blocks: its parameters, the deep baseline's compute
    assert count_params(recursion) == count_params(baseline)
    assert count_macs(recursion) == count_macs(deep) > count_macs(baseline)
    assert deep.recursions == 1 and sum(deep.cfg.blocks) == 2 * sum(baseline.cfg.blocks)
    # the NLL adds parameters and MACs, the LRC only scalars, the slicing only removes MACs
    assert count_params(with_nll) > count_params(recursion) and count_macs(with_nll) > count_macs(recursion)
    extra = {k for k in with_lrc.state_dict()} - {k for k in with_nll.state_dict()}
    assert extra and all(with_lrc.state_dict()[k].numel() == 1 for k in extra)
    assert count_params(sret) == count_params(with_lrc) and count_macs(sret) < count_macs(with_lrc)


def test_packed_groups_count_sliced_attention_at_one_over_g():
    """Theorem 1's count: each application with G groups costs 1/G of the two attention
    products (2 L^2 C MACs) of the unsliced model, whichever kernel runs the short sequences."""
    sliced, unsliced = create_model("sret_cifar"), create_model("sret_cifar_wo_slice")
    tokens, widths = (64, 16, 4), sliced.cfg.embed_dims
    saved = sum(blocks * 2 * tokens[s] ** 2 * widths[s] * (1 - 1 / g)
                for s, blocks in enumerate(sliced.cfg.blocks) for g in sliced.cfg.groups[s])
    assert saved > 0
    assert count_macs(sliced, packed_groups=True) == count_macs(unsliced) - saved
    assert count_macs(unsliced, packed_groups=True) == count_macs(unsliced)
    # as run, a sequence short enough for the masked single kernel is counted at its full cost
    assert count_macs(sliced, packed_groups=True) <= count_macs(sliced) < count_macs(unsliced)


def test_the_stride_4_stem_keeps_8x8_tokens_and_the_patch_stem_too():
    for stem in ("conv", "patch"):
        model = create_model("sret_cifar", stem=stem).eval()
        maps = model.forward_intermediates(torch.randn(2, 3, 32, 32), intermediates_only=True)
        assert [tuple(m.shape[1:]) for m in maps] == [(64, 8, 8), (128, 4, 4), (256, 2, 2)]
        assert [f["reduction"] for f in model.feature_info] == [4, 8, 16]
    conv, patch = create_model("sret_cifar"), create_model("sret_cifar", stem="patch")
    assert [m.conv.stride[0] for m in conv.stem] == [2, 2, 1]
    assert patch.stem.proj.kernel_size == (4, 4) and patch.stem.proj.stride == (4, 4)
    # a 64-pixel input interpolates the position embedding (dynamic size), 24 pixels is refused
    assert create_model("sret_cifar").eval()(torch.randn(1, 3, 64, 64)).shape == (1, 10)
    with pytest.raises(ValueError, match="divisible by 16"):
        create_model("sret_cifar")(torch.randn(1, 3, 24, 24))


def test_stem_options_are_checked():
    with pytest.raises(ValueError, match="stem must be"):
        create_model("sret_cifar", stem="conv3")
    with pytest.raises(ValueError, match="stem_stride must be"):
        create_model("sret_cifar", stem_stride=3)


def test_without_nll_the_applications_follow_each_other():
    torch.manual_seed(0)
    model = create_model("sret_cifar_wo_slice", nll_ratio=0, lrc=False, drop_path_rate=0.0).eval()
    block = model.stages[0].blocks[0]
    assert block.nlls is None and block.recursions == 2
    tokens = torch.randn(2, 64, 64)
    assert torch.allclose(block(tokens), block.layer(block.layer(tokens)), atol=1e-6)
