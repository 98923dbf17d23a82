"""Keyword names the vision models used to take, still accepted with a one-line FutureWarning.

Recorded experiments keep building the models they recorded (``--model-kwargs nll=False``):
each old name is translated into the one way of saying it before the model's configuration is
built. The words are the core's: ``nll_ratio`` is the NLL's hidden ratio (0: no NLL),
``recursions`` the applications a shared layer is built with, ``depth`` the applications that
run (``set_depth``); a count of unique layers is ``layers``.
"""

import warnings

#: the NLL ratio that ``nll=True`` meant where the configuration's ratio is 0: the default of
#: the configurations that had an ``nll`` switch
NLL_RATIO_OF_NLL_TRUE = 1.0


#: the warning of the old name of :class:`~fairseq_sret.vision.SReTVisionConfig`
SRET_CONFIG_RENAMED = (
    "fairseq_sret.vision's SReTConfig is now SReTVisionConfig (fairseq_sret.hf.SReTConfig is the transformers config)"
)


def deprecated(message: str, stacklevel: int = 4) -> None:
    """A FutureWarning (shown by default) for an old name; ``stacklevel`` 4 points at the code
    that built the model (the caller of the model's ``__init__``)."""
    warnings.warn(message, FutureWarning, stacklevel=stacklevel)


def translate_nll(kwargs: dict, ratio_in_effect: float) -> dict:
    """``kwargs`` with ``nll`` (True/False) replaced by ``nll_ratio``: False gives 0, True the
    ratio in effect (``kwargs``' own or the configuration's ``ratio_in_effect``), or
    :data:`NLL_RATIO_OF_NLL_TRUE` where that is 0."""
    if "nll" not in kwargs:
        return kwargs
    kwargs = dict(kwargs)
    nll = kwargs.pop("nll")
    if not isinstance(nll, bool):
        raise ValueError(f"nll must be True or False, got {nll!r}")
    if nll:
        deprecated("nll=True is deprecated: an NLL is built whenever nll_ratio > 0 (nll_ratio=0: none)")
        if not kwargs.get("nll_ratio", ratio_in_effect):
            kwargs["nll_ratio"] = NLL_RATIO_OF_NLL_TRUE
    else:
        deprecated("nll=False is deprecated: pass nll_ratio=0 (0: no NLL)")
        kwargs["nll_ratio"] = 0.0
    return kwargs


def translate_mixer(kwargs: dict) -> dict:
    """``kwargs`` of the recursive MLP-Mixer with ``depth`` (its unique layers) renamed
    ``layers`` and ``nll_ratio=None`` made 0."""
    kwargs = dict(kwargs)
    if "depth" in kwargs:
        if "layers" in kwargs:
            raise ValueError("depth is the old name of layers: pass layers only")
        deprecated("depth= is deprecated for the Mixer's unique layers: pass layers= (depth is what set_depth runs)")
        kwargs["layers"] = kwargs.pop("depth")
    if "nll_ratio" in kwargs and kwargs["nll_ratio"] is None:
        deprecated("nll_ratio=None is deprecated: pass nll_ratio=0 (0: no NLL)")
        kwargs["nll_ratio"] = 0.0
    return kwargs

