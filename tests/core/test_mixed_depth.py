"""Mixed-depth training (the paper's explicit deep supervision) in the core: the options and
the loss on a vision model (the fairseq criterion: tests/models/test_mixed_depth_criterion.py).
"""

import pytest
import torch

from fairseq_sret.core import (
    DepthTerm, DepthWarmup, check_mixed_depth, mixed_depth_loss, parse_depth_warmup, parse_mixed_depth,
)
from test_depth import tiny_sret


pytestmark = pytest.mark.usefixtures("single_thread")


def test_parse_mixed_depth_forms_and_errors():
    assert parse_mixed_depth("") == () and parse_mixed_depth(None) == ()
    assert parse_mixed_depth("1:0.5") == (DepthTerm((1,), 0.5),)
    assert parse_mixed_depth("1:0.3, 2") == (DepthTerm((1,), 0.3), DepthTerm((2,), 1.0))
    assert parse_mixed_depth("1:0.5,1/2:0.25", sides=2) == (DepthTerm((1, 1), 0.5), DepthTerm((1, 2), 0.25))
    assert [t.label for t in parse_mixed_depth("1,2/1", sides=2)] == ["1", "2_1"]
    bad = {
        "1:": "DEPTH\\[:WEIGHT\\]", ":0.5": "DEPTH\\[:WEIGHT\\]", "a:0.5": "integers", "0:1": ">= 1",
        "1:x": "must be a number", "1:0": "> 0", "1:-1": "> 0", "1:nan": "finite", "1:0.5,1:0.2": "listed twice",
        "1/2": "one depth",
    }
    for value, message in bad.items():
        with pytest.raises(ValueError, match="--mixed-depth.*" + message):
            parse_mixed_depth(value)
    with pytest.raises(ValueError, match="gives 3 depths"):
        parse_mixed_depth("1/1/1", sides=2)
    with pytest.raises(ValueError, match="larger than the 2 recursions the decoder"):
        check_mixed_depth(parse_mixed_depth("1/3", sides=2), (3, 2), sides=("the encoder", "the decoder"))
    with pytest.raises(ValueError, match="full depth"):
        check_mixed_depth(parse_mixed_depth("2"), (2,))
    check_mixed_depth(parse_mixed_depth("2", sides=2), (3, 2))  # shallower in the encoder


def test_parse_depth_warmup_forms_and_errors():
    assert parse_depth_warmup("") is None and parse_depth_warmup(None) is None
    assert parse_depth_warmup("1:400") == DepthWarmup((1,), 400)
    assert parse_depth_warmup("1/2:30", sides=2) == DepthWarmup((1, 2), 30)
    assert parse_depth_warmup("1:30", sides=2).active(29) and not parse_depth_warmup("1:30", sides=2).active(30)
    for value, message in {"1": "DEPTH:UPDATES", "1:2,2:3": "DEPTH:UPDATES", "1:x": "integer", "1:0": "at least 1",
                           "0:5": ">= 1", ":5": "DEPTH"}.items():
        with pytest.raises(ValueError, match="--depth-warmup.*" + message):
            parse_depth_warmup(value)


# ----------------------------------------------------------------------- vision
def test_vision_shallow_loss_reaches_the_shared_blocks_and_head():
    torch.manual_seed(7)
    model = tiny_sret().train()
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 3])
    with model.at_depth(1):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    named = dict(model.named_parameters())
    for name in ("stages.0.blocks.0.layer.ffn.fc1.weight", "stages.1.blocks.1.layer.self_attn.qkv.weight",
                 "stages.0.blocks.0.nlls.0.mlp.fc1.weight", "head.weight", "stem.0.conv.weight"):
        assert named[name].grad is not None and named[name].grad.abs().sum() > 0, name
    skipped = [n for n in named if ".nlls.1." in n]
    assert skipped and all(named[n].grad is None for n in skipped)


def test_mixed_depth_loss_sums_the_weighted_depths_and_restores_the_depth():
    torch.manual_seed(8)
    model = tiny_sret(recursions=3).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        full = model(x).square().mean()
        total, losses = mixed_depth_loss(model, parse_mixed_depth("1:0.5,2"), full, lambda: model(x).square().mean())
        with model.at_depth(1):
            depth1 = model(x).square().mean()
        with model.at_depth(2):
            depth2 = model(x).square().mean()
    assert list(losses) == ["3", "1", "2"] and model.depth == 3
    assert torch.equal(losses["1"], depth1) and torch.equal(losses["2"], depth2)
    torch.testing.assert_close(total, full + 0.5 * depth1 + depth2)
