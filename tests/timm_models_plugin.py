"""pytest plugin: run timm's own ``tests/test_models.py``, unmodified, on the fairseq-sret models.

Loaded with ``-p timm_models_plugin`` (this folder on ``sys.path``) by
``tests/vision/test_timm.py``, which runs the file from timm's source distribution. The plugin

- imports :mod:`fairseq_sret.vision` before the file is collected, so that the ``list_models()``
  calls in its parametrizations list our models;
- joins our models to the three test functions that timm limits to its own modules with
  ``forward_intermediates()`` (the file's ``FEAT_INTER_FILTERS``, module names): our models have
  it, and a module name of ours in that list is what the file would need;
- keeps only the cases of our models (the file's other cases test timm's own models, or timm's
  loading from the network) and deselects the TorchScript cases: TorchScript is deprecated in
  torch 2.14 and these models do not support it (docs/vision.md says why).

Nothing else is changed: timm's markers, fixtures, input sizes and tolerances apply as they are.
"""

import pytest

import fairseq_sret.vision  # noqa: F401  (registers the models with timm)
from fairseq_sret.vision import list_models

OUR_MODELS = frozenset(list_models())

#: test functions the file parametrizes with ``list_models(module=FEAT_INTER_FILTERS, ...)``
FORWARD_INTERMEDIATES_TESTS = (
    "test_model_forward_intermediates_features",
    "test_model_forward_intermediates",
    "test_prune_intermediate_layers_contract",
)
#: TorchScript cases (not supported, see docs/vision.md)
TORCHSCRIPT_TESTS = ("test_model_forward_torchscript", "test_model_forward_fx_torchscript")

_joined = set()


def _is_timm_test_models(metafunc) -> bool:
    return metafunc.module.__name__.rsplit(".", 1)[-1] == "test_models" and hasattr(metafunc.module, "FEAT_INTER_FILTERS")


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    if not _is_timm_test_models(metafunc) or metafunc.function.__name__ not in FORWARD_INTERMEDIATES_TESTS:
        return
    markers = metafunc.definition.own_markers
    for i, mark in enumerate(markers):
        if mark.name == "parametrize" and mark.args[0] == "model_name":
            names = list(mark.args[1]) + sorted(OUR_MODELS - set(mark.args[1]))
            markers[i] = pytest.mark.parametrize("model_name", names, **mark.kwargs).mark
            _joined.add(metafunc.function.__name__)


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        ours = params.get("model_name") in OUR_MODELS
        (keep if ours and item.originalname not in TORCHSCRIPT_TESTS else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session):
    missing = set(FORWARD_INTERMEDIATES_TESTS) - _joined
    if missing and any(i.fspath.basename == "test_models.py" for i in session.items):
        raise pytest.UsageError(f"timm_models_plugin: no model_name parametrization found in {sorted(missing)}")
