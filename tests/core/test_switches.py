"""The run-time switches: one module, set and restored, one is_compiling() for every layer."""

import copy

import pytest
import torch

from fairseq_sret.core import SlicedGroupAttention, config, fused, partition
from fairseq_sret.core.attention import decoding, grouped, kernels


def test_fast_paths_set_restore_and_reject_unknown_modes():
    before = config.get_fast_paths()
    with config.fast_paths(fused=config.FUSED_OFF, grouped_one_kernel=0) as inside:
        assert inside == config.get_fast_paths() and inside.fused == "off" and inside.grouped_one_kernel == 0
        assert inside.lrc_one_op == before.lrc_one_op
    assert config.get_fast_paths() == before
    previous = config.set_fast_paths(lrc_one_op=False)
    try:
        assert previous == before and not config.get_fast_paths().lrc_one_op
    finally:
        config.set_fast_paths(**vars(previous))
    with pytest.raises(ValueError, match="fused must be one of"):
        config.set_fast_paths(fused="sometimes")
    with pytest.raises(TypeError):
        config.set_fast_paths(no_such_switch=True)
    assert config.get_fast_paths() == before


def test_is_compiling_is_true_only_while_torch_compile_traces():
    seen = []

    def step(x):
        seen.append(config.is_compiling())
        return x + 1

    torch.compile(step, backend="eager", fullgraph=True)(torch.ones(2))
    assert seen == [True] and not config.is_compiling()
    # every layer asks the same function
    for module in (decoding, grouped, kernels, fused, partition):
        assert module.is_compiling is config.is_compiling


def test_modules_read_the_switches_when_built_and_apply_fast_paths_changes_one_model():
    with config.fast_paths(grouped_one_kernel=0, one_query_attention="sdpa"):
        built_inside = SlicedGroupAttention(8, 2, groups=2)
        assert built_inside.one_kernel_max_length == 0 and not built_inside.one_query_matmul
    default = config.get_fast_paths().grouped_one_kernel
    # the process-wide change ends for every module, this one too
    assert built_inside.one_kernel_max_length == default and built_inside.one_query_matmul
    one, other = torch.nn.Sequential(SlicedGroupAttention(8, 2, groups=2)), SlicedGroupAttention(8, 2, groups=2)
    chosen = config.apply_fast_paths(one, grouped_one_kernel=5)
    assert chosen.grouped_one_kernel == 5 and config.get_fast_paths().grouped_one_kernel == default
    assert one[0].one_kernel_max_length == 5 and other.one_kernel_max_length == default
    copied = copy.deepcopy(one)
    assert copied[0].one_kernel_max_length == 5  # a copy keeps its model's choices
    with config.fast_paths(grouped_one_kernel=7):  # and follows process-wide changes
        assert copied[0].one_kernel_max_length == one[0].one_kernel_max_length == other.one_kernel_max_length == 7
    with pytest.raises(ValueError, match="one_query_attention must be one of"):
        config.apply_fast_paths(one, one_query_attention="auto")
    x = torch.randn(2, 12, 8)
    forward = copied(x)
    config.apply_fast_paths(copied, grouped_one_kernel=0)  # packed groups: the same function
    torch.testing.assert_close(copied(x), forward, rtol=1e-5, atol=1e-6)
