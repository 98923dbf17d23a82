"""Map fairseq ``transformer`` weights onto ``sret_transformer`` parameter names.

With one recursion, no NLL, no LRC and one group, an SReT model computes exactly what
fairseq's transformer computes, so a fairseq transformer checkpoint can initialise it
(and the equivalence is tested this way). fairseq keeps q/k/v in three matrices; our
attention keeps one ``qkv`` matrix (rows q, k, v).
"""

import re
from typing import Dict

import torch
from torch import Tensor

_LAYER = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(.+)$")
_RENAMES = {
    "self_attn.out_proj": "self_attn.out_proj",
    "encoder_attn.out_proj": "cross_attn.out_proj",
    "self_attn_layer_norm": "self_attn_norm",
    "encoder_attn_layer_norm": "cross_attn_norm",
    "fc1": "ffn.fc1",
    "fc2": "ffn.fc2",
    "final_layer_norm": "ffn_norm",
}


def fairseq_transformer_to_sret(state_dict: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """Return a state dict for ``sret_transformer`` (recursions=1) from a fairseq
    ``transformer`` state dict. Non-layer parameters keep their names."""
    out: Dict[str, Tensor] = {}
    qkv_parts: Dict[str, Dict[str, Tensor]] = {}
    for name, value in state_dict.items():
        match = _LAYER.match(name)
        if match is None:
            out[name] = value
            continue
        side, index, rest = match.groups()
        prefix = f"{side}.layers.{index}.recursive.layer."
        proj = re.match(r"^(self_attn|encoder_attn)\.(q|k|v)_proj\.(weight|bias)$", rest)
        if proj:
            module, which, kind = proj.groups()
            target = "self_attn" if module == "self_attn" else "cross_attn"
            qkv_parts.setdefault(f"{prefix}{target}.qkv.{kind}", {})[which] = value
            continue
        module, _, kind = rest.rpartition(".")
        if module not in _RENAMES:
            raise KeyError(f"no SReT counterpart for fairseq parameter {name!r}")
        out[f"{prefix}{_RENAMES[module]}.{kind}"] = value
    for name, parts in qkv_parts.items():
        if set(parts) != {"q", "k", "v"}:
            raise KeyError(f"incomplete q/k/v projections for {name!r}: {sorted(parts)}")
        out[name] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out
