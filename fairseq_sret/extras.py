"""The optional dependencies of fairseq-sret, by the pip extra that installs them.

The core, the vision models and the transformers adapter need only torch; translation with
fairseq, the transformers export, timm and the plots come with extras. A missing one is named
in one line with the install command (:func:`missing_extra_message`, :func:`require`).
"""

import importlib
from typing import Optional

#: top-level module -> the extra of ``pip install 'fairseq-sret[EXTRA]'`` that installs it
EXTRA_OF_MODULE = {
    "fairseq": "fairseq",
    "fairseq_cli": "fairseq",
    "omegaconf": "fairseq",
    "hydra": "fairseq",
    "sacrebleu": "fairseq",
    "sacremoses": "fairseq",
    "sentencepiece": "fairseq",  # also in 'hf'
    "transformers": "hf",
    "safetensors": "hf",
    "timm": "timm",
    "PIL": "vision",
    "matplotlib": "plot",
    "onnx": "onnx",
    "onnxscript": "onnx",
    "onnxruntime": "onnx",
    "torchao": "int8",
    "ctranslate2": "deploy",
}


class MissingExtraError(ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def missing_extra_message(error: ImportError, purpose: str = "") -> Optional[str]:
    """One line naming the extra that installs the module ``error`` could not import (what
    needs it: ``purpose``), or None when the module is not one of our optional dependencies
    (a real bug, not an install)."""
    module = (getattr(error, "name", None) or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(module)
    if isinstance(error, MissingExtraError):
        return str(error)
    if not isinstance(error, ModuleNotFoundError) or extra is None:
        return None
    return f"{purpose + ' ' if purpose else ''}needs {module}, which is not installed: pip install 'fairseq-sret[{extra}]'"


def require(module: str, purpose: str):
    """Import ``module`` for ``purpose`` (e.g. "the fairseq plugin"), or raise
    :class:`MissingExtraError` (a ModuleNotFoundError) with one line naming the extra that
    installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        message = missing_extra_message(error, purpose)
        if message is None:
            raise
        raise MissingExtraError(message, name=error.name) from None
