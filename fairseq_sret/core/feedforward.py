"""Position-wise MLPs: the transformer FFN (paper Eq. 3) and the NLL (paper Eq. 5/8)."""

from typing import Callable, Optional, Tuple, Union

import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from .fold import FoldsLRC
from .linear import FUSABLE_ACTIVATIONS, linear
from .residual import LearnableResidual

# A torch.fx trace records each layer as one call to ``linear``, which picks oneDNN or PyTorch
# when the graph runs (its choice reads the input's size, unknown to a symbolic trace).
torch.fx.wrap("linear")

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_accurate": lambda x: F.gelu(x, approximate="tanh"),
    "tanh": lambda x: x.tanh(),
    "silu": F.silu,
    "linear": lambda x: x,
}


def get_activation(name: str) -> Callable:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; allowed values: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class FeedForward(nn.Module):
    """``fc2(dropout(act(fc1(x))))``: (..., C) -> (..., C) with hidden width ``hidden_dim``."""

    def __init__(self, dim: int, hidden_dim: int, activation: str = "gelu", activation_dropout: float = 0.0):
        super().__init__()
        if hidden_dim < 1:
            raise ValueError(f"hidden_dim must be >= 1, got {hidden_dim}")
        self.activation = activation
        self.act = get_activation(activation)
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.activation_dropout = nn.Dropout(activation_dropout)

    def forward(self, x: Tensor, recursion: Optional[object] = None) -> Tensor:
        """``recursion``: the application's step (same computation in every application).

        At inference on the CPU the first layer and its activation are one oneDNN linear
        (:func:`fairseq_sret.core.linear.linear`)."""
        if self.activation in FUSABLE_ACTIVATIONS:
            h = linear(x, self.fc1, self.activation)
        else:
            h = self.act(linear(x, self.fc1))
        return linear(self.activation_dropout(h), self.fc2)


class NonLinearProjection(FoldsLRC, nn.Module):
    """NLL between two applications of a shared layer (paper Eq. 5, with LRC Eq. 8).

    ``NLL(z) = zeta * MLP(LN(z)) + theta * z`` with its own hidden ratio; never shared.
    (..., C) -> (..., C)
    """

    def __init__(
        self, dim: int, hidden_ratio: float = 1.0, lrc: bool = True, activation: str = "gelu",
        dropout: float = 0.0, activation_dropout: float = 0.0, norm_eps: float = 1e-5,
    ):
        super().__init__()
        if hidden_ratio <= 0:
            raise ValueError(f"NLL hidden_ratio must be > 0, got {hidden_ratio}")
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = FeedForward(dim, int(dim * hidden_ratio), activation, activation_dropout)
        self.dropout = nn.Dropout(dropout)
        self.residual = LearnableResidual(lrc)

    #: the LayerNorm that reads the input; ``forward`` takes ``normed`` / ``next_norm``
    #: (see :meth:`fairseq_sret.core.SReTBlock.forward`)
    chains_norms = True

    @property
    def input_norm(self) -> nn.LayerNorm:
        return self.norm

    def lrc_sublayers(self):
        """(LayerNorm, residual, last linear) of the one residual (for ``fold_lrc``)."""
        return [(self.norm, self.residual, self.mlp.fc2)]

    def forward(
        self, x: Tensor, recursion: Optional[object] = None, normed: Optional[Tensor] = None,
        next_norm: Optional[nn.LayerNorm] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """``recursion``: the step of the application this NLL follows. ``normed``:
        ``self.norm(x)`` computed by the caller; with ``next_norm`` returns
        ``(out, next_norm(out))``, the LayerNorm fused with the residual where possible."""
        h = normed if normed is not None else self.norm(x)
        branch = self.dropout(self.mlp(h, recursion))
        if next_norm is None:
            return self.residual(x, branch)
        return self.residual.forward_norm(x, branch, next_norm)
