"""timm's model conventions, shared by the SReT, CCT and recursive Mixer classifiers (no timm
import), and the checks of the settings they share (``global_pool``, ``nll_ratio``,
``attention_layer``).

:class:`ClassifierConventions` gives a model with ``head``, ``num_features``, ``num_classes``
and ``global_pool`` attributes the methods every timm user calls: ``get_classifier``,
``reset_classifier``, ``set_grad_checkpointing``. :func:`feature_take_indices` is timm's rule
for the ``indices`` of ``forward_intermediates`` / ``prune_intermediate_layers``, and
:func:`build_on` builds a model's tensors on a device (timm's ``device=`` argument).
"""

import math
from contextlib import contextmanager, nullcontext
from numbers import Real
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from ..core import Recursive
from ..core.attention import ATTENTION_LAYERS

#: ``global_pool`` values: average (the papers'), max, their mean, or none ('': a per-position head)
GLOBAL_POOLS = ("avg", "max", "avgmax", "")


def check_global_pool(global_pool: str) -> str:
    if global_pool not in GLOBAL_POOLS:
        raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}, got {global_pool!r}")
    return global_pool


def check_nll_ratio(value) -> None:
    """``nll_ratio`` of every model, as the core's specs check it: a finite number >= 0 (0: no NLL)."""
    if not isinstance(value, Real) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"nll_ratio must be a finite number >= 0 (0: no NLL), got {value!r}")


def check_attention_layer(name: str) -> str:
    """``attention_layer`` of SReT and CCT: a name registered with
    :func:`~fairseq_sret.core.attention.register_attention_layer`."""
    if not isinstance(name, str) or name not in ATTENTION_LAYERS:
        registered = ATTENTION_LAYERS.names()
        raise ValueError(f"attention_layer must be a registered attention layer ({registered}), got {name!r}")
    return name


def pool_features(x: Tensor, pool: str, dims: Tuple[int, ...]) -> Tensor:
    """Pool ``x`` over ``dims`` (``pool`` one of :data:`GLOBAL_POOLS` but '')."""
    if pool == "avg":
        return x.mean(dim=dims)
    if pool == "max":
        return x.amax(dim=dims)
    return 0.5 * (x.mean(dim=dims) + x.amax(dim=dims))


def feature_take_indices(count: int, indices: Union[None, int, Sequence[int]] = None) -> Tuple[List[int], int]:
    """timm's selection of intermediates among ``count``: None all, an int ``n`` the last n, a
    sequence those indices (negative ones count from the end). Returns (indices, largest)."""
    if indices is None:
        indices = count
    if isinstance(indices, int):
        if not 0 < indices <= count:
            raise ValueError(f"take the last n intermediates: n must be 1 to {count}, got {indices}")
        take = list(range(count - indices, count))
    else:
        take = [count + i if i < 0 else i for i in indices]
        bad = [i for i, t in zip(indices, take) if not 0 <= t < count]
        if bad or not take:
            raise ValueError(f"intermediate indices must be in -{count}..{count - 1}, got {list(indices)}")
    return take, max(take)


@contextmanager
def build_on(device: Optional[Union[str, torch.device]]) -> Iterator[None]:
    """Create the tensors of the modules built inside on ``device`` (None: the default device),
    so that a model for ``device="meta"`` or ``"cuda"`` is never allocated elsewhere first."""
    with torch.device(device) if device is not None else nullcontext():
        yield


class ClassifierConventions:
    """``get_classifier`` / ``reset_classifier`` / ``set_grad_checkpointing`` for a model (an
    ``nn.Module``) whose ``head`` maps ``num_features`` pooled features to ``num_classes``."""

    head: nn.Module
    num_features: int
    num_classes: int
    global_pool: str

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A new head for ``num_classes`` (0: none, the model returns its features) on the device
        and in the dtype of the model; ``global_pool`` None keeps the pooling."""
        if global_pool is not None:
            self.global_pool = check_global_pool(global_pool)
        self.num_classes = num_classes
        if num_classes > 0:
            reference = next(self.parameters())
            self.head = nn.Linear(self.num_features, num_classes, device=reference.device, dtype=reference.dtype)
            self.head.train(self.training)
        else:
            self.head = nn.Identity()

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each application of a shared layer in the backward pass to save memory."""
        for module in self.modules():
            if isinstance(module, Recursive):
                module.checkpoint = enable
