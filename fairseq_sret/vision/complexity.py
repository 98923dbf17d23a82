"""Parameter and multiply-accumulate (MAC) counts.

The paper's "FLOPs" are multiply-accumulates of the convolutions, the linear layers and
the two attention matrix products (``q k^T`` and ``attn v``), the convention of fvcore,
which the official numbers follow: our counts reproduce the official SReT-T 1.112G (sliced)
and 1.366G (without slice) exactly. Normalisation, activations, softmax, residual sums
and biases are not counted.

We count with :class:`torch.utils.flop_counter.FlopCounterMode` (MACs = FLOPs / 2) on a
single image in eval mode. Sliced attention is counted as it runs by default: packed into
``G`` groups of ``L/G`` tokens it costs ``1/G`` of global attention, but a sequence short
enough for the masked single kernel (``fast_paths(grouped_one_kernel=...)``, e.g. CIFAR's 8x8
tokens) computes the whole ``L x L`` product and is counted so. ``packed_groups=True`` counts
every sliced attention as packed groups, the paper's ``1/G`` (Theorem 1), whatever path the
device would pick.
"""

from typing import Dict, Tuple, Union

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

aten = torch.ops.aten


def _sdpa_cpu_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# torch's flop counter knows the CUDA attention kernels; add the CPU one.
_CUSTOM = {}
if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
    _CUSTOM[aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_cpu_flops


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of distinct parameters (a shared block counts once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _input_size(model: nn.Module, img_size) -> Tuple[int, int]:
    if img_size is None:
        cfg = getattr(model, "cfg", None)
        if cfg is None or getattr(cfg, "img_size", None) is None:
            raise ValueError("pass img_size: the model does not record its input size")
        img_size = cfg.img_size
    return (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)


def count_macs(
    model: nn.Module, img_size: Union[int, Tuple[int, int], None] = None, in_chans: int = 3,
    by_operator: bool = False, packed_groups: bool = False,
) -> Union[int, Dict[str, int]]:
    """MACs of one forward pass on a single ``in_chans x H x W`` image (eval mode).

    ``img_size`` defaults to the resolution the model was built for. With
    ``by_operator=True`` returns ``{operator name: MACs}`` instead of the total.
    ``packed_groups``: count sliced attention at ``1/G`` (packed groups), not as it runs.
    """
    if packed_groups:
        from fairseq_sret.core.config import fast_paths

        with fast_paths(grouped_one_kernel=0):
            return count_macs(model, img_size, in_chans, by_operator)
    h, w = _input_size(model, img_size)
    param = next(model.parameters())
    x = torch.zeros(1, in_chans, h, w, device=param.device, dtype=param.dtype)
    was_training = model.training
    model.eval()
    counter = FlopCounterMode(display=False, custom_mapping=_CUSTOM)
    try:
        with torch.no_grad(), counter:
            model(x)
    finally:
        model.train(was_training)
    if by_operator:
        return {str(op): flops // 2 for op, flops in counter.get_flop_counts()["Global"].items()}
    return counter.get_total_flops() // 2
