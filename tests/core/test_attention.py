"""Properties of the sliced group attention."""

import itertools

import pytest
import torch
from torch import nn

from fairseq_sret.core import AttentionCache, SlicedGroupAttention
from fairseq_sret.core.partition import compute_partition

C, H = 16, 4


def make(groups=1, partition="contiguous", causal=False, seed=0, **kw):
    torch.manual_seed(seed)
    return SlicedGroupAttention(C, H, groups, partition, causal=causal, **kw)


def random_padding(batch, length, left, seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    lengths[0] = length
    pos = torch.arange(length)
    if left:
        return pos[None, :] < (length - lengths)[:, None]
    return pos[None, :] >= lengths[:, None]


def copy_to_torch_mha(attn):
    mha = nn.MultiheadAttention(C, H, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(attn.qkv.weight)
        mha.in_proj_bias.copy_(attn.qkv.bias)
        mha.out_proj.weight.copy_(attn.out_proj.weight)
        mha.out_proj.bias.copy_(attn.out_proj.bias)
    return mha


@pytest.mark.parametrize("padding", [None, "left", "right"])
def test_one_group_equals_torch_multihead_attention(padding):
    attn = make().eval()
    mha = copy_to_torch_mha(attn).eval()
    x = torch.randn(4, 11, C)
    kpm = None if padding is None else random_padding(4, 11, padding == "left")
    ours = attn(x, key_padding_mask=kpm)
    ref = mha(x, x, x, key_padding_mask=kpm, need_weights=False)[0]
    assert (ours - ref).abs().max() <= 1e-5


def test_causal_one_group_equals_torch_with_causal_mask():
    attn = make(causal=True).eval()
    mha = copy_to_torch_mha(attn).eval()
    x = torch.randn(2, 9, C)
    future = torch.ones(9, 9, dtype=torch.bool).triu(1)
    ref = mha(x, x, x, attn_mask=future, need_weights=False)[0]
    assert (attn(x) - ref).abs().max() <= 1e-5


def test_cross_attention_equals_torch_multihead_attention():
    attn = make(cross_attention=True).eval()
    mha = copy_to_torch_mha(attn).eval()
    x, mem = torch.randn(3, 5, C), torch.randn(3, 8, C)
    kpm = random_padding(3, 8, left=True)
    ref = mha(x, mem, mem, key_padding_mask=kpm, need_weights=False)[0]
    assert (attn(x, memory=mem, key_padding_mask=kpm) - ref).abs().max() <= 1e-5


def per_group_reference(attn, x, groups, mode):
    """Run 1-group attention on each group separately and put results back in place."""
    one = make()
    one.load_state_dict(attn.state_dict())
    one.eval()
    length = x.size(1)
    out = torch.empty_like(x)
    if mode == "contiguous":
        index_sets = torch.arange(length).tensor_split(groups)
    else:  # strided
        index_sets = [torch.arange(g, length, groups) for g in range(min(groups, length))]
    for idx in index_sets:
        if len(idx):
            out[:, idx] = one(x[:, idx])
    return out


@pytest.mark.parametrize("groups,length", [(2, 8), (4, 8), (3, 10), (4, 5), (8, 3), (1, 7)])
@pytest.mark.parametrize("mode", ["contiguous", "strided"])
def test_groups_attend_within_group_and_restore_order(groups, length, mode):
    attn = make(groups, mode).eval()
    x = torch.randn(2, length, C)
    ref = per_group_reference(attn, x, groups, mode)
    assert (attn(x) - ref).abs().max() <= 1e-5


def test_random_partition_in_eval_is_the_strided_partition_and_deterministic():
    attn = make(4, "random").eval()
    x = torch.randn(2, 13, C)
    a, b = attn(x), attn(x)
    assert torch.equal(a, b)
    assert (a - per_group_reference(attn, x, 4, "strided")).abs().max() <= 1e-5


def test_random_partition_is_fresh_in_training():
    attn = make(4, "random").train()
    x = torch.randn(2, 32, C)
    outs = [attn(x) for _ in range(3)]
    assert not torch.allclose(outs[0], outs[1]) or not torch.allclose(outs[1], outs[2])


def random_groups_reference(attn, x, groups, seed):
    """The official random partition: the slices of one permutation drawn as ``torch.rand``
    keys sorted, each slice attended alone (1-group attention) and put back in place."""
    torch.manual_seed(seed)
    order = torch.rand(x.size(1)).argsort()
    one = make()
    one.load_state_dict(attn.state_dict())
    out = torch.empty_like(x)
    for idx in order.tensor_split(groups):
        out[:, idx] = one(x[:, idx])
    return out, one


@pytest.mark.parametrize("groups,length", [(2, 8), (4, 12), (3, 10), (4, 6)])
def test_random_partition_groups_are_the_slices_of_one_permutation(groups, length):
    # equal groups (L divisible by G) take the permutation directly; others the general packing
    attn = make(groups, "random").train()
    x = torch.randn(2, length, C, requires_grad=True)
    torch.manual_seed(5)
    out = attn(x)
    ref, one = random_groups_reference(attn, x, groups, seed=5)
    assert (out - ref).abs().max() <= 1e-5
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), (x, attn.qkv.weight))
    want = torch.autograd.grad((ref * weights).sum(), (x, one.qkv.weight))
    for a, b in zip(got, want):
        assert (a - b).abs().max() <= 1e-5


def dependency_matrix(attn, x, recursion=0, kpm=None, seed=None):
    """D[i, j] = True when output token i has a non-zero gradient w.r.t. input token j."""
    length = x.size(1)
    dep = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        xi = x.clone().requires_grad_(True)
        if seed is not None:
            torch.manual_seed(seed)
        out = attn(xi, key_padding_mask=kpm, recursion=recursion)
        (grad,) = torch.autograd.grad(out[0, i].sum(), xi)
        assert torch.isfinite(grad).all()
        dep[i] = grad[0].abs().sum(-1) > 0
    return dep


@pytest.mark.parametrize("mode", ["contiguous", "strided", "random"])
def test_zero_gradient_across_groups(mode):
    groups, length = 4, 14
    attn = make(groups, mode).train()
    x = torch.randn(1, length, C)
    dep = dependency_matrix(attn, x, seed=123)  # same random partition for every row
    # The dependency relation is a partition into `groups` near-equal classes.
    classes = {tuple(row.nonzero().flatten().tolist()) for row in dep}
    assert len(classes) == groups
    assert sorted(len(c) for c in classes) == [3, 3, 4, 4]
    assert sorted(itertools.chain(*classes)) == list(range(length))
    for i in range(length):  # every token is in its own class
        assert dep[i, i]


@pytest.mark.parametrize("mode", ["strided", "random"])
@pytest.mark.parametrize("groups", [1, 2, 3])
def test_causal_never_depends_on_future(mode, groups):
    attn = make(groups, mode, causal=True).train()
    x = torch.randn(1, 10, C)
    dep = dependency_matrix(attn, x, seed=7)
    assert not dep.triu(1).any()
    assert dep.diagonal().all()


@pytest.mark.parametrize("groups", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("mode", ["strided", "random"])
def test_incremental_equals_full_causal_forward(groups, mode):
    attn = make((1, groups), ("strided", mode), causal=True).eval()
    x = torch.randn(3, 12, C)
    full = attn(x, recursion=1)
    cache = AttentionCache()
    steps = [attn(x[:, t : t + 1], recursion=1, cache=cache) for t in range(12)]
    assert (torch.cat(steps, dim=1) - full).abs().max() <= 1e-5
    # a prefix at once, then single steps
    cache = AttentionCache()
    parts = [attn(x[:, :5], recursion=1, cache=cache)]
    parts += [attn(x[:, t : t + 1], recursion=1, cache=cache) for t in range(5, 12)]
    assert (torch.cat(parts, dim=1) - full).abs().max() <= 1e-5


@pytest.mark.parametrize("groups", [1, 2, 3, 5, 16])
@pytest.mark.parametrize("length", [1, 2, 5, 9, 16])
@pytest.mark.parametrize("mode", ["contiguous", "strided", "random"])
def test_adversarial_padding_is_finite_and_never_attended(groups, length, mode):
    torch.manual_seed(length * 31 + groups)
    attn = make(groups, mode).train()
    batch = 5
    kpm = torch.rand(batch, length) < 0.5
    kpm[0] = True  # a sequence made only of padding
    kpm[1] = False
    x = torch.randn(batch, length, C, requires_grad=True)
    torch.manual_seed(0)
    out = attn(x, key_padding_mask=kpm)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    # Changing padded inputs changes nothing at real positions.
    x2 = x.detach().clone()
    x2[kpm] = 1e3 * torch.randn(int(kpm.sum()), C)
    torch.manual_seed(0)
    out2 = attn(x2, key_padding_mask=kpm)
    real = ~kpm
    assert (out[real] - out2[real]).abs().max() <= 1e-4


def test_partition_ignores_padding_so_batching_does_not_change_outputs():
    attn = make(3, "contiguous").eval()
    x = torch.randn(1, 7, C)
    alone = attn(x)
    padded = torch.cat([torch.randn(1, 4, C), x], dim=1)
    kpm = torch.zeros(1, 11, dtype=torch.bool)
    kpm[:, :4] = True
    batched = attn(padded, key_padding_mask=kpm)[:, 4:]
    assert (alone - batched).abs().max() <= 1e-5


def test_compute_partition_slots_and_inverse_are_consistent():
    valid = torch.tensor([[True] * 7 + [False] * 3, [False] * 2 + [True] * 8])
    for mode in ("contiguous", "strided", "random"):
        slots, slot_valid, inverse = compute_partition(valid, 10, 3, mode, torch.device("cpu"))
        for b in range(2):
            held = slots[b][slot_valid[b]]
            assert sorted(held.tolist()) == valid[b].nonzero().flatten().tolist()
            for pos in held.tolist():
                assert slots[b, inverse[b, pos]] == pos


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(groups=0), "groups"),
        (dict(groups=(2, -1)), "groups"),
        (dict(partition="shuffled"), "partition mode"),
        (dict(groups=2, partition="contiguous", causal=True), "contiguous"),
        (dict(groups=2, cross_attention=True), "cross-attention"),
        (dict(groups=(1, 2, 3), partition=("contiguous", "random")), "partition"),
    ],
)
def test_bad_configurations_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SlicedGroupAttention(C, H, **kwargs)


def test_heads_must_divide_width():
    with pytest.raises(ValueError, match="num_heads"):
        SlicedGroupAttention(10, 4)


def test_recursion_index_out_of_range():
    attn = make((2, 1))
    with pytest.raises(IndexError, match="recursion"):
        attn(torch.randn(1, 4, C), recursion=2)


def test_random_partition_incremental_requires_eval():
    attn = make(2, "random", causal=True).train()
    with pytest.raises(RuntimeError, match="eval"):
        attn(torch.randn(1, 1, C), cache=AttentionCache())
