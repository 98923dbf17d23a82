"""Learnable Residual Connection (LRC, paper Eq. 7-8)."""

from typing import Tuple

import torch
import torch.fx
from torch import Tensor, nn

from .fused import lrc_add, lrc_add_norm

# A torch.fx trace records each residual as one call to these functions: they pick the Triton
# kernel or PyTorch's addcmul (with its lean backward) when the graph runs.
torch.fx.wrap("lrc_add")
torch.fx.wrap("lrc_add_norm")


class LearnableResidual(nn.Module):
    """``y = skip_scale * x + branch_scale * f(x)``, both scalars initialised to 1.

    The paper's (beta, alpha) for attention, (delta, gamma) for the FFN and (theta, zeta)
    for the NLL. With ``learnable=False`` it is the plain residual ``x + f(x)`` and has no
    parameters.

    Computed as one operation (:func:`fairseq_sret.core.fused.lrc_add`): a Triton kernel on
    CUDA when Triton is installed, else ``torch.addcmul(skip_scale * x, branch_scale, f(x))``
    (two element-wise kernels instead of three, the same products and sum) with a lean
    backward (two multiplies, two dot products for the coefficients' gradients).
    :meth:`forward_norm` also applies the LayerNorm that reads the result (pre-LN layers),
    in the same kernel where the fused kernel is available.
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
        return lrc_add(skip, branch, self.skip_scale, self.branch_scale)

    def forward_norm(self, skip: Tensor, branch: Tensor, norm: nn.LayerNorm) -> Tuple[Tensor, Tensor]:
        """``(res, norm(res))`` with ``res = self(skip, branch)``."""
        if not self.learnable:
            return lrc_add_norm(skip, branch, None, None, norm)
        return lrc_add_norm(skip, branch, self.skip_scale, self.branch_scale, norm)

    def extra_repr(self) -> str:
        return f"learnable={self.learnable}"


class FoldedResidual(nn.Module):
    """``skip_factor * x + f(x)`` with a constant ``skip_factor``: an LRC after
    :func:`fairseq_sret.core.fold_lrc`, whose branch scale now sits in the branch's last
    linear layer. One element-wise kernel (``x + f(x)`` when the factor is 1); no parameters.
    """

    learnable = False

    def __init__(self, skip_factor: float = 1.0):
        super().__init__()
        self.skip_factor = float(skip_factor)

    def _factor(self):
        return None if self.skip_factor == 1.0 else self.skip_factor

    def forward(self, skip: Tensor, branch: Tensor) -> Tensor:
        return lrc_add(skip, branch, self._factor(), None)

    def forward_norm(self, skip: Tensor, branch: Tensor, norm: nn.LayerNorm) -> Tuple[Tensor, Tensor]:
        return lrc_add_norm(skip, branch, self._factor(), None, norm)

    def extra_repr(self) -> str:
        return f"skip_factor={self.skip_factor!r}"
