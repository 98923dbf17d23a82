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
