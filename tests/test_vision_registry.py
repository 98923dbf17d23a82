"""Vision registry: timm registration and import without fairseq."""

import os
import subprocess
import sys
import types
from collections import defaultdict

import pytest
import torch

from fairseq_sret.vision import SReT, list_models, register_with_timm
from fairseq_sret.vision.factory import TIMM_MODULE


pytestmark = pytest.mark.usefixtures("single_thread")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_timm():
    """The parts of timm's registry that registration and timm.create_model use."""
    timm = types.ModuleType("timm")
    models = types.ModuleType("timm.models")
    entrypoints, module_to_models = {}, defaultdict(set)

    def register_model(fn):  # as timm.models._registry.register_model
        mod = sys.modules[fn.__module__]
        mod.__all__ = getattr(mod, "__all__", []) + [fn.__name__]
        entrypoints[fn.__name__] = fn
        module_to_models[fn.__module__.split(".")[-1]].add(fn.__name__)
        return fn

    def create_model(model_name, pretrained=False, pretrained_cfg=None, pretrained_cfg_overlay=None, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if v is not None}  # as timm does
        return entrypoints[model_name](
            pretrained=pretrained, pretrained_cfg=pretrained_cfg, pretrained_cfg_overlay=pretrained_cfg_overlay, **kwargs
        )

    models.register_model = register_model
    models.is_model = lambda name: name in entrypoints
    models.create_model = timm.create_model = create_model
    models.entrypoints = entrypoints
    timm.models = models
    return timm


def test_models_register_with_timm(monkeypatch):
    timm = fake_timm()
    monkeypatch.setitem(sys.modules, "timm", timm)
    monkeypatch.setitem(sys.modules, "timm.models", timm.models)
    monkeypatch.setitem(sys.modules, TIMM_MODULE, types.ModuleType(TIMM_MODULE))
    assert register_with_timm()
    assert set(timm.models.entrypoints) == set(list_models())
    model = timm.create_model("sret_t", num_classes=5, img_size=64, drop_rate=None)
    assert isinstance(model, SReT) and model.cfg.num_classes == 5
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 5)
    with pytest.raises(ValueError, match="checkpoint_path"):
        timm.create_model("sret_t", pretrained=True)
    # a second call does not register twice
    before = dict(timm.models.entrypoints)
    assert register_with_timm()
    assert timm.models.entrypoints == before


def test_no_timm_means_no_registration(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)
    assert register_with_timm() is False


@pytest.mark.e2e
def test_vision_imports_and_runs_without_fairseq():
    code = "\n".join([
        "import sys",
        "sys.modules['fairseq'] = None  # hide fairseq",
        "import torch",
        "import fairseq_sret.vision as vision",
        "model = vision.create_model('sret_t', num_classes=3, img_size=64).eval()",
        "assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)",
        "loaded = [m for m in sys.modules if m.startswith('fairseq.') or m.startswith('fairseq_sret.models')]",
        "assert not loaded, loaded",
        "print('vision ok')",
    ])
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "vision ok" in out.stdout
