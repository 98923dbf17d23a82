"""SReT's code paths as they were before issue #6's optimizations, for A/B measurements.

``bench_vision.py --legacy MODEL`` measures a model with these patched in, next to the
current code, in the same process. Copied from commit bb37d4c:

- ``RecursiveStage.forward`` ran the blocks on a transposed (B, HW, C) view, so every
  LayerNorm copied its input and the residual stream stayed strided;
- ``SlicedGroupAttention._forward_grouped`` recomputed the partition (argsort/scatter
  gathers) in every forward of a strided (or eval-mode random) recursion and read two
  values back from the device (``int(sizes.max())`` in ``compute_partition``,
  ``bool(slot_valid.all())``).

Outputs equal the current code's bit for bit; only the speed differs.
"""

import types

import torch

from fairseq_sret.core.attention import SlicedGroupAttention
from fairseq_sret.core.partition import compute_partition
from fairseq_sret.vision.sret import RecursiveStage


def _stage_forward(self, x):
    b, c, h, w = x.shape
    x = x.flatten(2).transpose(1, 2)
    for block in self.blocks:
        x = block(x)
    return x.transpose(1, 2).reshape(b, c, h, w)


def _compute_partition_with_sync(valid, length, groups, mode, device):
    slots, slot_valid, inverse = compute_partition(valid, length, groups, mode, device)
    int(slot_valid.sum())  # the old compute_partition's int(sizes.max()): a device-to-host read
    return slots, slot_valid, inverse


def _forward_grouped(self, qkv, key_padding_mask, recursion, groups):
    batch, length, _ = qkv.shape
    channels = self.embed_dim
    mode = self.partition_at(recursion)
    if mode == "random" and not self.training:
        mode = "strided"
    valid = None if key_padding_mask is None else ~key_padding_mask
    in_order = valid is None and mode == "contiguous" and length % groups == 0
    if in_order:
        width = length // groups
        slot_valid = inverse = None
        packed = qkv
    else:
        slots, slot_valid, inverse = _compute_partition_with_sync(valid, length, groups, mode, qkv.device)
        width = slots.size(1) // groups
    if in_order:
        pass
    elif slots.size(0) == 1:
        packed = qkv.index_select(1, slots[0])
    else:
        packed = qkv.gather(1, slots.unsqueeze(-1).expand(-1, -1, 3 * channels))
    packed = packed.view(batch * groups, width, 3, self.num_heads, self.head_dim)
    gq, gk, gv = packed.permute(2, 0, 3, 1, 4).unbind(0)
    mask = None
    if slot_valid is not None and not bool(slot_valid.all()):
        key_ok = slot_valid.view(-1, groups, width).expand(batch, -1, -1).reshape(batch * groups, 1, 1, width)
        mask = key_ok
        if self.causal:
            mask = mask & torch.ones(width, width, dtype=torch.bool, device=qkv.device).tril()
    out = self._attend(gq, gk, gv, mask, is_causal=self.causal and mask is None)
    out = out.permute(0, 2, 1, 3).reshape(batch, groups * width, channels)
    if in_order:
        pass
    elif inverse.size(0) == 1:
        out = out.index_select(1, inverse[0])
    else:
        out = out.gather(1, inverse.unsqueeze(-1).expand(-1, -1, channels))
    if valid is not None:
        out = out * valid.unsqueeze(-1).to(out.dtype)
    return out


def patch_legacy(model):
    """Give every stage and attention module of ``model`` its pre-#6 code path (in place)."""
    for module in model.modules():
        if isinstance(module, RecursiveStage):
            module.forward = types.MethodType(_stage_forward, module)
        if isinstance(module, SlicedGroupAttention):
            module._forward_grouped = types.MethodType(_forward_grouped, module)
    return model
