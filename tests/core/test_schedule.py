"""The recursion schedule: one parser for per-recursion settings, depth, and the step
that reaches every sub-module of an application."""

import pytest
import torch
from torch import nn

from fairseq_sret.core import (
    NonLinearProjection,
    RecursionSchedule,
    RecursionStep,
    Recursive,
    SReTBlock,
    SlicedGroupAttention,
    at_depth,
    check_depth,
    set_depth,
)

C = 16


@pytest.mark.parametrize("groups", ["8,2", (8, 2), [8, 2]])
def test_parse_accepts_strings_ints_and_sequences(groups):
    schedule = RecursionSchedule.parse(2, groups=groups, partition="contiguous,random")
    assert schedule.groups == (8, 2)
    assert schedule.partitions == ("contiguous", "random")
    assert [s.index for s in schedule] == [0, 1]
    assert [s.nll for s in schedule] == [0, 1]


def test_one_value_applies_to_every_recursion_and_auto_partition():
    enc = RecursionSchedule.parse(3, groups=4, partition="auto")
    dec = RecursionSchedule.parse(3, groups="2", partition="auto", causal=True)
    assert enc.groups == (4, 4, 4) and dec.groups == (2, 2, 2)
    assert enc.partitions == ("contiguous", "random", "random")
    assert dec.partitions == ("strided", "random", "random")


def test_repeat_last_only_when_asked():
    assert RecursionSchedule.parse(3, groups=(8, 2), repeat_last=True).groups == (8, 2, 2)
    with pytest.raises(ValueError, match=r"--decoder-groups has 2 values but there are 3 recursions; give 1 or 3"):
        RecursionSchedule.parse(3, groups="1,2", names={"groups": "--decoder-groups"})


@pytest.mark.parametrize(
    "kwargs,option",
    [
        (dict(recursions=0), "--encoder-recursions"),
        (dict(recursions=1.5), "--encoder-recursions"),
        (dict(groups=""), "--encoder-groups"),
        (dict(groups="2;1"), "--encoder-groups"),
        (dict(groups="1.5"), "--encoder-groups"),
        (dict(groups=(2.5,)), "--encoder-groups"),
        (dict(groups="0"), "--encoder-groups"),
        (dict(recursions=2, groups="2,2,2"), "--encoder-groups"),
        (dict(partition="sorted"), "--encoder-partition"),
        (dict(recursions=2, partition="contiguous,random,strided"), "--encoder-partition"),
        (dict(recursions=2, groups="2", partition="strided,contiguous", causal=True), "--encoder-partition"),
        (dict(recursions=2, depth=3), "--encoder-depth"),
        (dict(recursions=2, depth=0), "--encoder-depth"),
    ],
)
def test_every_error_names_its_option(kwargs, option):
    kwargs.setdefault("recursions", 1)
    names = {k: f"--encoder-{k}" for k in ("recursions", "groups", "partition", "depth")}
    with pytest.raises(ValueError, match=option):
        RecursionSchedule.parse(names=names, **kwargs)


def test_depth_keeps_the_schedule_and_skips_later_applications():
    schedule = RecursionSchedule.parse(3, groups="4,2,1")
    shallow = schedule.with_depth(1)
    assert len(shallow) == 3 and shallow.depth == 1
    assert [s.runs for s in shallow] == [True, False, False]
    assert shallow.running() == (schedule[0],)
    assert shallow.with_depth(None).depth == 3
    with pytest.raises(ValueError, match="larger than the 3 recursions"):
        schedule.with_depth(4)
    with pytest.raises(ValueError, match="prefix"):
        RecursionSchedule(tuple(RecursionStep(index=i, runs=i == 1) for i in range(2)))


def test_step_stands_for_its_index_but_is_no_int():
    step = RecursionStep(index=2, groups=4)
    assert int(step) == 2 and step != 2
    assert ["a", "b", "c"][step] == "c"
    assert step == RecursionStep(index=2, groups=4) and step != RecursionStep(index=2, groups=8)
    assert len({step, RecursionStep(index=2, groups=4)}) == 1


class StepRecorder(nn.Module):
    """Records the ``recursion`` argument a sub-module receives."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.seen = inner, []

    def forward(self, x, *args, recursion=None, **kwargs):
        self.seen.append(recursion)
        return self.inner(x, *args, recursion=recursion, **kwargs)


def test_every_sub_module_of_an_application_receives_its_step():
    torch.manual_seed(0)
    schedule = RecursionSchedule.parse(2, groups="2,1", partition="contiguous,strided")
    block = SReTBlock(C, 4, 32, schedule=schedule, cross_attention=True)
    rec = Recursive(block, schedule, make_nll=lambda i: NonLinearProjection(C, 1.0)).eval()
    for name in ("self_attn", "cross_attn", "ffn"):
        setattr(block, name, StepRecorder(getattr(block, name)))
    rec.nlls = nn.ModuleList(StepRecorder(n) for n in rec.nlls)
    rec(torch.randn(1, 6, C), memory=torch.randn(1, 3, C))
    for module in (block.self_attn, block.cross_attn, block.ffn):
        assert module.seen == list(schedule)
        assert [s.groups for s in module.seen] == [2, 1]
    assert rec.nlls[0].seen == [schedule[0]] and rec.nlls[1].seen == [schedule[1]]


def test_recursive_at_depth_equals_a_model_built_with_fewer_recursions():
    torch.manual_seed(0)
    deep_schedule = RecursionSchedule.parse(3, groups="2,1,1")
    block = SReTBlock(C, 4, 32, schedule=deep_schedule)
    deep = Recursive(block, deep_schedule, make_nll=lambda i: NonLinearProjection(C, 1.0)).eval()
    shallow = Recursive(block, RecursionSchedule.parse(1, groups=2), make_nll=lambda i: NonLinearProjection(C, 1.0)).eval()
    shallow.nlls[0].load_state_dict(deep.nlls[0].state_dict())
    x = torch.randn(2, 6, C)
    full = deep(x)
    with at_depth(deep, 1):
        assert deep.depth == 1
        torch.testing.assert_close(deep(x), shallow(x), rtol=0, atol=0)
    assert deep.depth == 3
    torch.testing.assert_close(deep(x), full, rtol=0, atol=0)
    set_depth(deep, 2)
    expected = deep.nlls[1](block(deep.nlls[0](block(x, recursion=0)), recursion=1))
    torch.testing.assert_close(deep(x), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="larger than"):
        set_depth(deep, 4)


def test_one_depth_check_for_counts_depths_and_schedules():
    assert check_depth(3) == 3 and check_depth(2, 3) == 2 and check_depth(3, 3) == 3
    for bad in (0, -1, 1.0, True, "2", None):
        with pytest.raises(ValueError, match=r"^layer depth must be an integer >= 1"):
            check_depth(bad, 3, name="layer depth")
    with pytest.raises(ValueError, match=r"^depth=4 is larger than the 3 recursions the layer was built"
                                         r" \(and trained\) with; use a depth from 1 to 3$"):
        check_depth(4, 3)
    with pytest.raises(ValueError, match=r"^n=2 is larger than the 1 recursions it has; try 1$"):
        check_depth(2, 1, name="n", built="it has", fix="try 1")
    # the schedule, Recursive and the parser all go through it
    with pytest.raises(ValueError, match=r"^depth=4 is larger than the 3 recursions"):
        RecursionSchedule.parse(3).with_depth(4)
    with pytest.raises(ValueError, match=r"^recursions must be an integer >= 1, got 0"):
        Recursive(nn.Identity(), 0)
    with pytest.raises(ValueError, match=r"^--recursions must be an integer >= 1, got 0"):
        RecursionSchedule.parse(0, names={"recursions": "--recursions"})


def test_standalone_attention_keeps_its_own_schedule():
    attn = SlicedGroupAttention(C, 4, groups="4,1", partition="contiguous")
    assert attn.groups == (4, 1) and attn.partition == ("contiguous", "contiguous")
    assert attn.groups_at(0) == 4 and attn.groups_at(RecursionStep(index=5, groups=2)) == 2
    single = SlicedGroupAttention(C, 4, groups=8)
    assert single.groups_at(7) == 8  # one value: every recursion index
