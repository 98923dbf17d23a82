"""Attention kernels: ``fn(q, k, v, mask, dropout, is_causal) -> out``, registered by name.

q: (N, H, Lq, d); k, v: (N, H, Lk, d); mask: None or bool, True = may attend, broadcastable
to (N, H, Lq, Lk), at least one allowed key per row; returns (N, H, Lq, d).
:func:`attend` picks the kernel and handles rows without any allowed key.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..config import is_compiling
from .registry import ATTENTION_KERNELS


@ATTENTION_KERNELS.register("sdpa")
def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout: float, is_causal: bool) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal)


@ATTENTION_KERNELS.register("one_query_matmul")
def attend_one_query(
    q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout: float = 0.0, is_causal: bool = False
) -> Tensor:
    """softmax(q k^T / sqrt(d)) v for one query per row (Lq = 1, no dropout, not causal), as
    two matrix products (the paper's Eq. 2), the way fairseq's decoder computes a decoding
    step. A few small kernels whose cost follows the work, where SDPA's are built for many
    queries (:class:`~fairseq_sret.core.config.FastPaths`)."""
    scores = torch.matmul(q * q.size(-1) ** -0.5, k.transpose(-2, -1))
    if mask is not None:
        scores = torch.where(mask, scores, float("-inf"))  # one kernel; masked_fill needs ~mask first
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def one_query_by_matmul(q: Tensor, dropout: float, is_causal: bool, by_matmul: bool) -> bool:
    """Whether :func:`attend_one_query` computes this attention: one query per row, no
    dropout, not causal, and the layer chose it (``by_matmul``, the switch
    ``one_query_attention`` read when the layer was built)."""
    return by_matmul and q.size(-2) == 1 and dropout == 0.0 and not is_causal


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout: float, is_causal: bool,
    every_row_has_key: bool = False, one_query_matmul: bool = False,
) -> Tensor:
    """Attention with rows that have no allowed key zeroed instead of NaN (shapes as the
    kernels'). ``every_row_has_key``: the caller knows that every query may attend to some
    key (no fix-up needed); ``one_query_matmul``: single-query rows take
    :func:`attend_one_query` (:func:`one_query_by_matmul`), everything else :func:`sdpa`."""
    kernel = ATTENTION_KERNELS["one_query_matmul" if one_query_by_matmul(q, dropout, is_causal, one_query_matmul)
                               else "sdpa"]
    if mask is None or every_row_has_key:
        return kernel(q, k, v, mask, dropout, is_causal)
    row_has_key = mask.any(dim=-1, keepdim=True)
    safe_mask = mask | ~row_has_key
    out = kernel(q, k, v, safe_mask, dropout, False)
    # Zero the rows without keys. On accelerators multiply unconditionally (exact: x * 1
    # is x) rather than read ``row_has_key.all()``, a device-to-host sync; so too while
    # torch.compile / torch.export (ONNX) trace, where the value is not known.
    if out.device.type != "cpu" or is_compiling() or not bool(row_has_key.all()):
        out = out * row_has_key.to(out.dtype)
    return out
