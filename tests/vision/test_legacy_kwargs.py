"""Old keyword names of the vision models build the same models as the new ones, with a warning.

``nll_ratio`` (0: no NLL) is the one way to say the NLL, as in the core's specs; ``layers`` is
a count of unique layers, ``depth`` what ``set_depth`` runs. Recorded experiments use the old
names (``--model-kwargs nll=False``), so they keep working, each with one FutureWarning.
"""

import warnings

import pytest
import torch

from fairseq_sret.vision import create_model


pytestmark = pytest.mark.usefixtures("single_thread")

SMALL_MIXER = dict(img_size=32, embed_dim=32, token_mlp_dim=16, channel_mlp_dim=64)


def built(name, **kwargs):
    """The model, seeded, with the FutureWarnings its kwargs raised."""
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = create_model(name, **kwargs)
    return model, [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def assert_same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a.cfg == b.cfg


def test_mixer_depth_is_layers_with_a_warning():
    old, messages = built("recursive_mixer_b16", depth=2, **SMALL_MIXER)
    new, none = built("recursive_mixer_b16", layers=2, **SMALL_MIXER)
    assert_same_model(old, new)
    assert none == [] and len(messages) == 1 and "layers=" in messages[0] and "\n" not in messages[0]
    assert new.cfg.layers == 2 and len(new.blocks) == 2 and new.depth == new.recursions == 2
    with pytest.raises(ValueError, match="old name of layers"):
        create_model("recursive_mixer_b16", depth=2, layers=2, **SMALL_MIXER)


def test_mixer_nll_ratio_none_is_zero_with_a_warning():
    old, messages = built("recursive_mixer_b16", nll_ratio=None, **SMALL_MIXER)
    new, none = built("recursive_mixer_b16", nll_ratio=0, **SMALL_MIXER)
    assert list(old.state_dict()) == list(new.state_dict()) and old.blocks[0].nlls is None
    assert none == [] and len(messages) == 1 and "nll_ratio=0" in messages[0]
    with_nll, _ = built("recursive_mixer_b16", nll_ratio=0.5, **SMALL_MIXER)
    assert len(with_nll.blocks[0].nlls) == 2
    for bad in (-1.0, float("nan"), "0.5", True):
        with pytest.raises(ValueError, match="nll_ratio must be a finite number >= 0"):
            create_model("recursive_mixer_b16", nll_ratio=bad, **SMALL_MIXER)


# --------------------------------------------------------------------------- nll -> nll_ratio
@pytest.mark.parametrize("name, old, new", [
    ("sret_cifar_wo_slice", dict(nll=False, lrc=False), dict(nll_ratio=0, lrc=False)),
    ("sret_cifar", dict(nll=True), dict()),
    ("sret_cifar_baseline", dict(nll=True), dict(nll_ratio=1.0)),
    ("sret_cct_2_3x2_32", dict(nll=False, lrc=False), dict(nll_ratio=0, lrc=False)),
    ("sret_cct_2_3x2_32", dict(recursions=1, nll=False, lrc=False), dict(recursions=1, nll_ratio=0, lrc=False)),
    ("cct_2_3x2_32", dict(nll=True), dict(nll_ratio=1.0)),
    ("cct_2_3x2_32", dict(nll=True, nll_ratio=2.0), dict(nll_ratio=2.0)),
])
def test_nll_switch_builds_the_model_of_its_nll_ratio(name, old, new):
    before, messages = built(name, **old)
    after, none = built(name, **new)
    assert_same_model(before, after)
    assert none == [] and len(messages) == 1 and "nll_ratio=0" in messages[0] and "\n" not in messages[0]
    assert all((layer.nlls is None) == (after.cfg.nll_ratio == 0) for layer in after.modules()
               if hasattr(layer, "nlls"))


@pytest.mark.parametrize("name", ["sret_cifar", "sret_cct_2_3x2_32"])
def test_nll_ratio_is_checked_as_the_core_checks_it(name):
    for bad in (-0.5, float("inf"), "1", None):
        with pytest.raises(ValueError, match="nll_ratio must be a finite number >= 0"):
            create_model(name, nll_ratio=bad)
    with pytest.raises(ValueError, match="nll must be True or False"):
        create_model(name, nll="maybe")


def test_recorded_experiments_build_the_models_they_recorded():
    """Every ``--model-kwargs`` of the example experiment files builds, and where it uses an
    old name, builds the model of the new one."""
    import ast
    import pathlib
    import shlex

    yaml = pytest.importorskip("yaml")
    renamed = {"nll": lambda v: ("nll_ratio", None if v else 0)}

    def literal(value):  # as sret-train-cifar reads --model-kwargs
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value

    rows = []
    for path in sorted((pathlib.Path(__file__).parents[2] / "examples").rglob("*.yaml")):
        for row in (yaml.safe_load(path.read_text()) or {}).get("rows", []):
            words = shlex.split(row.get("args", ""))
            if "--model-kwargs" in words:
                pairs = []
                for word in words[words.index("--model-kwargs") + 1:]:
                    if word.startswith("--"):
                        break
                    pairs.append(word.split("=", 1))
                rows.append((row["model"], {k: literal(v) for k, v in pairs}))
    assert rows, "the examples record runs with --model-kwargs"
    for model, kwargs in rows:
        before, _ = built(model, **kwargs)
        new = dict(kwargs)
        for old_name, rename in renamed.items():
            if old_name in new:
                key, value = rename(new.pop(old_name))
                if value is not None:
                    new[key] = value
        after, none = built(model, **new)
        assert none == []
        assert_same_model(before, after)


def test_the_vision_config_has_its_own_name():
    import fairseq_sret.vision as vision
    import fairseq_sret.vision.sret as sret

    for module in (vision, sret):
        with pytest.warns(FutureWarning, match="SReTVisionConfig"):
            assert module.SReTConfig is vision.SReTVisionConfig
    assert "SReTConfig" not in vision.__all__
    hf = pytest.importorskip("fairseq_sret.hf")
    assert hf.SReTConfig is not vision.SReTVisionConfig


def test_the_old_sret_module_names_still_import():
    """``fairseq_sret.vision.sret`` was one module; every public name it had (and the helpers
    other modules import) still imports from it, the registered constructors among them."""
    import fairseq_sret.vision.sret as sret
    from fairseq_sret.vision.registry import get_constructor, list_models

    names = ["SLICED_GROUPS", "GLOBAL_GROUPS", "PARTITION", "ConvBNReLU", "ConvStem", "PatchStem", "ConvPooling",
             "RecursiveStage", "SReT", "resize_pos_embed", "CIFAR10_MEAN", "CIFAR10_STD", "_pair", "_tokens_to_map",
             "_prepare_input", "_add_pos_embed"]
    assert all(hasattr(sret, name) for name in names)
    registered = [name for name in list_models("sret_*") if "cct" not in name]  # the CCTs live in cct.py
    assert set(sret.constructors.__all__) == set(registered)
    assert all(getattr(sret, name) is get_constructor(name) for name in registered)
