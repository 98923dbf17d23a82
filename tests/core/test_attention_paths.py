"""The code paths of sliced group attention compute the same function, and unpadded
contiguous/strided groups never gather.

- packed groups (reshape/transpose, or a partition and gathers) against one masked attention
  kernel over the whole sequence (``fast_paths(grouped_one_kernel=...)``);
- SReT-T in eval(): no gather, scatter, sort or random draw; in training only the random
  partitions (one per random recursion) draw and gather;
- cached partitions and masks bypass the cache while compiling or capturing a CUDA graph.
"""

import itertools
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq_sret.core import AttentionCache, SlicedGroupAttention, config, fast_paths
from fairseq_sret.core.attention import GROUPED_ATTENTION, one_query_by_matmul
from fairseq_sret.core import partition as partition_module
from fairseq_sret.vision import create_model

C, H = 16, 2


def _run(attn, x, mask, recursion, one_kernel):
    x = x.detach().clone().requires_grad_(True)
    attn.zero_grad()
    with fast_paths(grouped_one_kernel=one_kernel):
        out = attn(x, key_padding_mask=mask, recursion=recursion)
    out.square().sum().backward()
    return out, x.grad, attn.qkv.weight.grad.clone()


CASES = [
    case for case in itertools.product(
        [7, 12, 16],  # lengths (divisible by G or not)
        [2, 3, 4],  # groups
        ["contiguous", "strided"],
        [False, True],  # causal
        [False, True],  # padded batch
    )
    if not (case[3] and case[2] == "contiguous")  # causal attention has no contiguous groups
]


@pytest.mark.parametrize("length,groups,mode,causal,padded", CASES)
def test_one_kernel_equals_packed_groups(length, groups, mode, causal, padded):
    torch.manual_seed(length * 100 + groups)
    attn = SlicedGroupAttention(C, H, groups=groups, partition=mode, causal=causal).double()
    x = torch.randn(3, length, C, dtype=torch.float64)
    mask = None
    if padded:
        mask = torch.zeros(3, length, dtype=torch.bool)
        mask[0, -2:] = True
        mask[2, :3] = True
    packed = _run(attn, x, mask, 0, one_kernel=0)
    single = _run(attn, x, mask, 0, one_kernel=10**6)
    for a, b in zip(packed, single):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_one_kernel_threshold_by_length(monkeypatch):
    attn = SlicedGroupAttention(C, H, groups=4)
    calls = []
    original = GROUPED_ATTENTION["one_kernel"]
    monkeypatch.setitem(GROUPED_ATTENTION._parts, "one_kernel", lambda *a: calls.append(a) or original(*a))
    x = torch.randn(2, 16, C)
    with fast_paths(grouped_one_kernel=16):
        attn(x)
    with fast_paths(grouped_one_kernel=15):
        attn(x)
    with fast_paths(grouped_one_kernel=0):
        attn(torch.randn(2, 4, C))
    assert len(calls) == 1
    # CPU defaults: unpadded up to 32 tokens, padded up to 128
    attn(torch.randn(2, 32, C))
    attn(torch.randn(2, 33, C))
    attn(torch.randn(2, 128, C), key_padding_mask=torch.zeros(2, 128, dtype=torch.bool))
    assert len(calls) == 3


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket).split(".")[-1]] += 1
        return func(*args, **(kwargs or {}))


GATHERS = ("index_select", "gather", "scatter", "scatter_", "scatter_add_", "sort", "argsort", "rand", "index")


def test_sret_t_eval_never_gathers_and_training_gathers_only_for_random_groups():
    torch.manual_seed(0)
    model = create_model("sret_t", img_size=64, num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)  # stage 1: 8x8 = 64 tokens, groups 8 then 2
    with torch.no_grad(), fast_paths(grouped_one_kernel=0), _OpLog() as log:
        model(x)
    assert not {op: n for op, n in log.ops.items() if op in GATHERS}, log.ops
    model.train()
    with fast_paths(grouped_one_kernel=0), _OpLog() as log:
        model(x).sum().backward()
    # stage 1's second recursion (2 groups, random partition) in each of its 2 shared blocks
    assert log.ops["rand"] == 2, log.ops


def test_partition_cache_bypassed_while_compiling(monkeypatch):
    partition_module._CACHE.clear()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    partition_module.cached_partition(10, 3, "strided", torch.device("cpu"))
    partition_module.cached_group_mask(10, 3, "strided", torch.device("cpu"))
    assert not partition_module._CACHE
    monkeypatch.undo()
    mask = partition_module.cached_group_mask(10, 3, "contiguous", torch.device("cpu"))
    assert mask.shape == (1, 1, 10, 10) and len(partition_module._CACHE) == 1
    assert partition_module.cached_group_mask(10, 3, "contiguous", torch.device("cpu")) is mask


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_one_query_matmul_equals_sdpa_in_incremental_decoding(groups, padded, monkeypatch):
    """A decoding step's attention as two matrix products (the default) is SDPA's function:
    causal self-attention with groups and padding, and cross-attention to a memory with a
    source that is all padding (zeros, never NaN)."""
    torch.manual_seed(groups)
    self_attn = SlicedGroupAttention(C, H, groups=groups, partition="strided", causal=True).eval()
    cross = SlicedGroupAttention(C, H, cross_attention=True).eval()
    x, memory = torch.randn(3, 6, C), torch.randn(3, 5, C)
    memory_padding = torch.zeros(3, 5, dtype=torch.bool)
    step_padding = torch.zeros(3, 6, dtype=torch.bool)
    if padded:
        memory_padding[1, :2] = True
        memory_padding[2] = True
        step_padding[0, :2] = True

    def decode(mode):
        caches = (AttentionCache(), AttentionCache())
        outs = []
        with fast_paths(one_query_attention=mode):
            for t in range(6):
                h = self_attn(x[:, t:t + 1], key_padding_mask=step_padding[:, t:t + 1] if padded else None,
                              cache=caches[0])
                outs.append(cross(h, memory=memory, key_padding_mask=memory_padding, cache=caches[1]))
        return torch.cat(outs, dim=1)

    reference = decode("sdpa")
    sdpa_calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: sdpa_calls.append(1) or sdpa(*a, **k))
    by_matmul = decode("matmul")
    assert not sdpa_calls  # every step took the matrix products
    torch.testing.assert_close(by_matmul, reference, rtol=1e-6, atol=1e-6)
    assert not by_matmul.isnan().any() and by_matmul[:2].abs().min() > 0
    sdpa_calls.clear()
    torch.testing.assert_close(decode(config.get_fast_paths().one_query_attention), by_matmul, rtol=0, atol=0)
    assert not sdpa_calls  # the default


def test_one_query_matmul_only_for_single_query_steps_without_dropout():
    one, many = torch.empty(2, H, 1, 8), torch.empty(2, H, 4, 8)
    assert one_query_by_matmul(one, 0.0, False, True)
    assert not one_query_by_matmul(many, 0.0, False, True) and not one_query_by_matmul(one, 0.1, False, True)
    assert not one_query_by_matmul(one, 0.0, True, True) and not one_query_by_matmul(one, 0.0, False, False)
    attn = SlicedGroupAttention(C, H)
    assert attn.one_query_matmul
    with fast_paths(one_query_attention="sdpa"):
        assert not attn.one_query_matmul  # a built module follows the process-wide switch
    with pytest.raises(ValueError, match="one_query_attention must be one of"):
        with fast_paths(one_query_attention="auto"):
            pass
