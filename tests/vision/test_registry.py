"""Vision registry: pretrained configs, no timm registration without timm, import without fairseq."""

import os
import subprocess
import sys

import pytest

from fairseq_sret.vision import create_model, list_models, register_with_timm


pytestmark = pytest.mark.usefixtures("single_thread")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_model_has_its_pretrained_config():
    for name in list_models():
        cfg = create_model(name, device="meta").pretrained_cfg
        assert cfg["architecture"] == name
        cifar = "_cifar" in name or name.endswith("_32")  # the CIFAR SReTs and the CCTs
        size = 512 if name.endswith("_512") else 384 if name.endswith("_384") else 32 if cifar else 224
        assert cfg["input_size"] == (3, size, size)
        assert cfg["crop_pct"] == (0.875 if size == 224 else 1.0)
        assert cfg["num_classes"] == (10 if size == 32 else 1000)
        assert cfg["first_conv"] in ("stem.0.conv", "stem", "tokenizer.0.conv") and cfg["classifier"] == "head"
        assert cfg["fixed_input_size"] == name.endswith("mixer_b16")
    assert create_model("sret_t").default_cfg["notes"] == ("official ImageNet-1k weights: SReT_T",)
    assert "notes" not in create_model("sret_b", device="meta").pretrained_cfg


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
