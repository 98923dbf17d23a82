"""int8 inference: every linear layer with int8 weights (one scale per output channel) and
int8 activations quantized per token as it runs, through torchao (the ``int8`` extra).

This is torchao's ``Int8DynamicActivationInt8WeightConfig``, the configuration transformers
applies when an exported model is loaded with ``TorchAoConfig(int8_config())``; the fairseq
plugin applies the same to a loaded model with ``--model-overrides
"{'int8_in_generation': True}"``, so both front doors run one quantized model.

Output projections tied to an embedding stay in floating point (transformers leaves them
too): their weight is the embedding table, which the model also reads by row.
"""

from typing import Callable

from torch import nn

from ..extras import require
from .linear import has_plain_weight


def int8_config():
    """torchao's int8 dynamic-activation, int8-weight configuration (a new instance)."""
    quantization = require("torchao.quantization", "int8 inference")
    return quantization.Int8DynamicActivationInt8WeightConfig()


def _quantizable(model: nn.Module) -> Callable[[nn.Module, str], bool]:
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return lambda module, name: (isinstance(module, nn.Linear) and has_plain_weight(module)
                                 and id(module.weight) not in embedding_weights)


def quantize_int8_(model: nn.Module) -> nn.Module:
    """Quantize ``model``'s linear layers in place (:func:`int8_config`), except output
    projections tied to an embedding and layers quantized already; returns ``model``. For
    inference: the quantized layers do not train."""
    quantization = require("torchao.quantization", "int8 inference")
    quantization.quantize_(model, int8_config(), filter_fn=_quantizable(model))
    return model


def is_int8(layer: nn.Module) -> bool:
    """``layer`` is a linear layer whose weight :func:`quantize_int8_` (or transformers'
    ``TorchAoConfig``) replaced by a quantized tensor."""
    return isinstance(layer, nn.Linear) and not has_plain_weight(layer)
