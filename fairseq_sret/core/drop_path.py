"""Stochastic depth (drop a residual branch per sample), as used by DeiT/SReT training."""

from torch import Tensor, nn


class DropPath(nn.Module):
    def __init__(self, p: float = 0.0):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop path probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, ...) -> same; each sample's branch is kept with probability 1-p and rescaled.

        The per-sample factor (0 or 1/(1-p)) is made on the (B, 1, ...) mask, so the branch
        is read once forward and once backward (timm's ``drop_path``, the same random draws)."""
        # training first: in eval mode torch.compile then guards on no rate, so blocks of
        # different rates share one graph
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.size(0),) + (1,) * (x.dim() - 1)).bernoulli_(keep).div_(keep)
        return x * mask

    def extra_repr(self) -> str:
        return f"p={self.p}"
