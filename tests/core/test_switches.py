"""The run-time switches: one module, set and restored, one is_compiling() for every layer."""

import pytest
import torch

from fairseq_sret.core import attention, config, fused, partition


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
    for module in (attention, fused, partition):
        assert module.is_compiling is config.is_compiling
