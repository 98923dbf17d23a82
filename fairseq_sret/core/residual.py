"""Learnable Residual Connection (LRC, paper Eq. 7-8)."""

import torch
from torch import Tensor, nn


class LearnableResidual(nn.Module):
    """``y = skip_scale * x + branch_scale * f(x)``, both scalars initialised to 1.

    The paper's (beta, alpha) for attention, (delta, gamma) for the FFN and (theta, zeta)
    for the NLL. With ``learnable=False`` it is the plain residual ``x + f(x)`` and has no
    parameters.
    """

    def __init__(self, learnable: bool = True):
        super().__init__()
        self.learnable = learnable
        if learnable:
            self.skip_scale = nn.Parameter(torch.ones(1))
            self.branch_scale = nn.Parameter(torch.ones(1))

    def forward(self, skip: Tensor, branch: Tensor) -> Tensor:
        """skip, branch: same shape -> same shape."""
        if not self.learnable:
            return skip + branch
        return self.skip_scale * skip + self.branch_scale * branch

    def extra_repr(self) -> str:
        return f"learnable={self.learnable}"
