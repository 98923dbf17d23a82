"""Stochastic depth: timm's drop_path draw for draw (the official SReT trains with it), the
identity in eval mode, and a gradient that is the per-sample factor."""

import pytest
import torch

from fairseq_sret.core.drop_path import DropPath


def test_drop_path_is_timm_s_draw_for_draw():
    timm_layers = pytest.importorskip("timm.layers")
    x = torch.randn(64, 5, 8)
    layer = DropPath(0.3).train()
    torch.manual_seed(7)
    ours = layer(x)
    torch.manual_seed(7)
    theirs = timm_layers.drop_path(x, 0.3, training=True)
    assert torch.equal(ours, theirs)
    dropped = (ours == 0).all(dim=(1, 2))
    assert 0 < int(dropped.sum()) < 64  # some samples dropped, some kept
    assert torch.allclose(ours[~dropped], x[~dropped] / 0.7)


def test_drop_path_gradient_is_the_sample_s_factor_and_eval_is_identity():
    x = torch.randn(32, 4, requires_grad=True)
    layer = DropPath(0.5).train()
    torch.manual_seed(0)
    out = layer(x)
    out.sum().backward()
    kept = (out != 0).all(dim=1)
    assert 0 < int(kept.sum()) < 32
    assert bool((x.grad[kept] == 2.0).all()) and bool((x.grad[~kept] == 0).all())  # 1 / (1 - p)
    assert layer.eval()(x) is x
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        DropPath(1.0)
