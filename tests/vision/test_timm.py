"""The vision models as timm models, judged by timm itself.

- timm's own ``tests/test_models.py`` (from the source distribution of the installed timm,
  downloaded once with pip into ``.timm/``), unmodified, on every model
  (:mod:`timm_models_plugin` selects our cases);
- official checkpoints through timm's loading path, pretrained configs, ``features_only``,
  layer-wise learning-rate decay groups;
- timm's ``train.py``, ``validate.py`` and ``benchmark.py`` on a small generated ImageFolder.

Needs timm with a torchvision of the same torch build (``scripts/run_tests.sh`` installs one);
without it these tests skip, unless ``SRET_REQUIRE_TIMM=1`` (set by ``run_tests.sh``) makes
that a failure.
"""

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import REPO, SHARED, shared_path


def _import_timm():
    try:
        import timm
        import timm.data  # noqa: F401
    except Exception as err:  # ImportError, or a torchvision built for another torch
        if os.environ.get("SRET_REQUIRE_TIMM") == "1":
            pytest.fail(f"SRET_REQUIRE_TIMM=1 but timm does not import ({type(err).__name__}: {err})")
        pytest.skip(f"timm does not import here ({type(err).__name__}); scripts/run_tests.sh installs it", allow_module_level=True)
    return timm


timm = _import_timm()

import fairseq_sret.vision  # noqa: E402  (registers the models with timm)
from fairseq_sret.vision import count_params, create_model, list_models, load_checkpoint, save_checkpoint  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")

#: where timm's source distribution and scripts are kept (git-ignored)
TIMM_CACHE = REPO / ".timm"
MIXERS = {"mixer_b16", "recursive_mixer_b16"}
SRET_MODELS = set(list_models()) - MIXERS
#: the markers that timm's own CI runs test_models.py with, TorchScript left out (docs/vision.md);
#: the unmarked test_prune_intermediate_layers_contract, which timm's CI leaves out too (several
#: minutes for the two Mixers here), runs with SRET_TIMM_ALL=1
TIMM_MARKERS = "base or forward or backward or cfg or features or fxforward or fxbackward"
#: every test function of test_models.py that timm's parametrization runs on our models
EXPECTED_TESTS = {
    "test_model_forward": SRET_MODELS | MIXERS,
    "test_model_backward": SRET_MODELS | MIXERS,
    "test_model_default_cfgs": SRET_MODELS,
    "test_model_default_cfgs_non_std": MIXERS,  # '*mixer_*' is one of the file's NON_STD_FILTERS
    "test_model_forward_features": SRET_MODELS,
    "test_model_forward_intermediates_features": SRET_MODELS | MIXERS,
    "test_model_forward_intermediates": SRET_MODELS | MIXERS,
    "test_model_forward_fx": SRET_MODELS | MIXERS,
    "test_model_backward_fx": SRET_MODELS | MIXERS,
}
OFFICIAL = "fixtures/sret_official"
WRAPPER = 'import fairseq_sret.vision, runpy, sys; sys.argv.pop(0); runpy.run_path(sys.argv[0], run_name="__main__")'


def timm_source() -> Path:
    """The installed timm's source distribution, unpacked in ``.timm/`` (pip downloads it once)."""
    root = TIMM_CACHE / f"timm-{timm.__version__}"
    if not (root / "tests" / "test_models.py").is_file():
        TIMM_CACHE.mkdir(exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", f"timm=={timm.__version__}", "--no-deps",
             "--no-binary", ":all:", "-d", str(TIMM_CACHE), "-q"],
            check=True, timeout=300,
        )
        with tempfile.TemporaryDirectory(dir=TIMM_CACHE) as tmp, \
                tarfile.open(TIMM_CACHE / f"timm-{timm.__version__}.tar.gz") as sdist:
            sdist.extractall(tmp, filter="data")
            os.replace(Path(tmp) / root.name, root)
    return root


def _env() -> dict:
    path = [str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p), OMP_NUM_THREADS="1")


def _outcomes(junit: Path) -> dict:
    """{(test function, model): 'passed' | 'failed' | 'skipped' | 'error'} from a JUnit XML report."""
    outcomes = {}
    for case in ET.parse(junit).iter("testcase"):
        match = re.fullmatch(r"(\w+)\[(.+)\]", case.get("name"))
        model = next(p for p in match.group(2).split("-") if p in fairseq_sret.vision.list_models())
        result = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[(match.group(1), model)] = result[0] if result else "passed"
    return outcomes


@pytest.mark.e2e
def test_timm_model_tests_pass_on_every_model(tmp_path):
    root = timm_source()
    junit = tmp_path / "timm.xml"
    everything = os.environ.get("SRET_TIMM_ALL") == "1"
    command = [
        sys.executable, "-m", "pytest", "-p", "timm_models_plugin", str(root / "tests" / "test_models.py"),
        "--rootdir", str(root), "-c", str(root / "pyproject.toml"), "-p", "no:cacheprovider", "-q",
        "-W", "ignore", f"--junitxml={junit}", *([] if everything else ["-m", TIMM_MARKERS]),
    ]
    out = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=3600)
    outcomes = _outcomes(junit)
    counts = Counter((test, outcome) for (test, _), outcome in outcomes.items())
    print("\n".join(f"{test}: {n} {outcome}" for (test, outcome), n in sorted(counts.items())))
    bad = sorted(f"{test}[{model}]: {outcome}" for (test, model), outcome in outcomes.items() if outcome != "passed")
    assert out.returncode == 0 and not bad, "\n".join(bad) + "\n" + out.stdout[-4000:] + out.stderr[-2000:]
    expected = {(test, model) for test, models in EXPECTED_TESTS.items() for model in models}
    if everything:
        expected |= {("test_prune_intermediate_layers_contract", model) for model in list_models()}
    assert set(outcomes) == expected


# --------------------------------------------------------------------------- timm's model API
def test_every_model_is_registered_with_its_config():
    from fairseq_sret.vision.registry import get_pretrained_cfg

    assert set(timm.list_models(module="timm_models")) == set(list_models())
    for name in list_models():
        registered = timm.models.get_pretrained_cfg(name).to_dict()
        assert {k: registered[k] for k in get_pretrained_cfg(name)} == get_pretrained_cfg(name)


def test_pretrained_config_per_resolution():
    for name, size in [("sret_t", 224), ("sret_t_wo_slice_distill_384", 384), ("sret_s_wo_slice_distill_512", 512)]:
        model = timm.create_model(name)
        config = timm.data.resolve_data_config(model=model)
        assert config["input_size"] == (3, size, size) and config["crop_pct"] == (0.875 if size == 224 else 1.0)
        assert model.pretrained_cfg == model.default_cfg and model.pretrained_cfg["architecture"] == name
        assert model.pretrained_cfg["pool_size"] == (size // 32, size // 32)
    with torch.no_grad():  # a 384-pixel model at 224: the position embedding is interpolated
        assert timm.create_model("sret_t_distill_384").eval()(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_official_checkpoint_through_timms_loading_path():
    checkpoint = shared_path(OFFICIAL) / "SReT_T_random.pth"
    io = torch.load(shared_path(OFFICIAL) / "SReT_T_io.pt", map_location="cpu", weights_only=False)
    groups = ((1, 1), (1, 1), (1, 1))  # the fixture's deterministic "without slice" logits
    ours = load_checkpoint(create_model("sret_t", groups=groups), checkpoint).eval()
    model = timm.create_model("sret_t", groups=groups, pretrained=True, pretrained_cfg_overlay=dict(file=str(checkpoint)))
    model.eval()
    with torch.no_grad():
        logits = model(io["input"])
        assert torch.equal(logits, ours(io["input"]))
    assert (logits - io["logits_noslice"]).abs().max().item() <= 1e-6
    # another number of classes: timm drops the head, the rest loads
    tuned = timm.create_model("sret_t", num_classes=5, pretrained=True, pretrained_cfg_overlay=dict(file=str(checkpoint)))
    assert tuned.head.out_features == 5 and torch.equal(tuned.pos_embed, ours.pos_embed)
    # a backbone: features_only loads the weights, then drops what follows the last stage taken
    backbone = timm.create_model("sret_t", groups=groups, features_only=True, out_indices=(0, 1), pretrained=True,
                                 pretrained_cfg_overlay=dict(file=str(checkpoint))).eval()
    with torch.no_grad():
        _, expected = ours.forward_intermediates(io["input"][:1], indices=(0, 1))
        for got, want in zip(backbone(io["input"][:1]), expected):
            assert torch.equal(got, want)
    assert backbone.feature_info.channels() == [64, 128] and backbone.feature_info.reduction() == [8, 16]


def test_fx_feature_extraction_equals_forward_intermediates():
    from timm.models import FeatureGraphNet

    torch.manual_seed(0)
    model = timm.create_model("sret_t", img_size=64).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = model.forward_intermediates(x, intermediates_only=True)
        for got, want in zip(FeatureGraphNet(model, out_indices=(0, 1, 2)).eval()(x), expected):
            assert torch.equal(got, want)


def test_our_checkpoints_load_in_timms_scripts_format(tmp_path):
    torch.manual_seed(0)
    model = create_model("sret_t", img_size=64, num_classes=3).eval()
    save_checkpoint(model, tmp_path / "ours.pth")
    loaded = timm.create_model("sret_t", img_size=64, num_classes=3, checkpoint_path=str(tmp_path / "ours.pth")).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_layer_decay_groups_follow_depth():
    from timm.optim import param_groups_layer_decay

    model = timm.create_model("sret_t", img_size=64)
    groups = param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.5)
    scale_of = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    scale = {name: scale_of[id(p)] for name, p in model.named_parameters()}
    order = ["stem.0.conv.weight", "stages.0.blocks.0.layer.self_attn.qkv.weight",
             "stages.0.blocks.1.nlls.1.mlp.fc1.weight", "stages.1.blocks.0.layer.ffn.fc1.weight",
             "stages.2.blocks.2.layer.ffn.fc2.weight", "head.weight"]
    assert [scale[n] for n in order] == sorted(scale[n] for n in order) and len({scale[n] for n in order}) == 6
    assert scale["pos_embed"] == scale["stem.0.conv.weight"]
    assert scale["pools.0.conv.weight"] == scale["stages.0.blocks.1.layer.ffn.fc1.weight"]
    assert scale["head.weight"] == 1.0


@pytest.mark.parametrize("name", ["sret_t", "recursive_mixer_b16"])
def test_timm_reparameterize_model_folds_the_lrc_and_the_stem(name):
    """timm's ``reparameterize_model`` (``benchmark.py --reparam``): a copy with every LRC
    coefficient, and the stem's BatchNorms, folded into weights, computing the same logits."""
    from test_fold import randomize_lrc, rel_err, residual_kinds
    from timm.utils.model import reparameterize_model

    torch.manual_seed(0)
    mixer = "mixer" in name
    size = 32 if mixer else 64
    kwargs = dict(embed_dim=32, layers=2, token_mlp_dim=16, channel_mlp_dim=64) if mixer else {}
    model = timm.create_model(name, img_size=size, num_classes=10, **kwargs)
    randomize_lrc(model, seed=1)  # coefficients away from 1, some negative
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # BatchNorm statistics not the identity
        for norm in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
            norm.running_mean.uniform_(-0.5, 0.5, generator=g)
            norm.running_var.uniform_(0.5, 2.0, generator=g)
    model.eval()
    x = torch.randn(2, 3, size, size, generator=g)
    before = residual_kinds(model)[0]
    deployed = reparameterize_model(model).eval()
    # a copy, the model untouched
    assert before > 0 and residual_kinds(deployed)[0] == 0 and residual_kinds(model)[0] == before
    stems = [m for m in deployed.modules() if hasattr(m, "inference_weight")]
    assert all(m.inference_weight is not None for m in stems) and len(stems) == (0 if mixer else 3)
    with torch.no_grad():
        reference, folded = model(x), deployed(x)
    assert rel_err(reference, folded) < 1e-4


# --------------------------------------------------------------------------- timm's scripts
def _timm_scripts() -> Path:
    """timm's train.py, validate.py and benchmark.py: not in its source distribution, so from a
    checkout of timm's repository (SRET_TIMM_SCRIPTS) or ``.timm/scripts``."""
    folder = Path(os.environ.get("SRET_TIMM_SCRIPTS", TIMM_CACHE / "scripts"))
    if not all((folder / f).is_file() for f in ("train.py", "validate.py", "benchmark.py")):
        pytest.skip(f"timm's train.py, validate.py, benchmark.py not in {folder} (not in timm's sdist):"
                    " set SRET_TIMM_SCRIPTS to a checkout of timm's repository")
    return folder


def _run_script(script: Path, *args, cwd: Path) -> str:
    out = subprocess.run([sys.executable, "-c", WRAPPER, str(script), *map(str, args)], cwd=cwd, env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


@pytest.mark.e2e
def test_timm_scripts_train_validate_benchmark(tmp_path):
    from PIL import Image

    scripts = _timm_scripts()
    generator = torch.Generator().manual_seed(0)
    for split in ("train", "validation"):
        for label in ("cat", "dog"):
            (tmp_path / "data" / split / label).mkdir(parents=True)
            for i in range(4):
                pixels = torch.randint(0, 256, (40, 48, 3), generator=generator, dtype=torch.uint8)
                Image.fromarray(pixels.numpy()).save(tmp_path / "data" / split / label / f"{i}.png")
    common = ["--model", "sret_t", "--img-size", 64, "--num-classes", 2, "--workers", 0, "--device", "cpu"]
    start = []
    official = SHARED / OFFICIAL / "SReT_T_random.pth"
    if official.is_file():  # fine-tune an official checkpoint, read through timm's loading path
        start = ["--pretrained", "--pretrained-path", official]
    log = _run_script(scripts / "train.py", "--data-dir", tmp_path / "data", *common, *start, "--batch-size", 4,
                      "--epochs", 1, "--output", tmp_path / "out", "--experiment", "run", "--log-interval", 1,
                      "--no-prefetcher", "--warmup-epochs", 0, cwd=tmp_path)
    assert f"Model sret_t created, param count:{count_params(create_model('sret_t', num_classes=2))}" in log
    checkpoint = tmp_path / "out" / "run" / "last.pth.tar"
    assert checkpoint.is_file() and (tmp_path / "out" / "run" / "summary.csv").is_file()

    _run_script(scripts / "validate.py", tmp_path / "data" / "validation", *common, "--checkpoint", checkpoint,
                "--batch-size", 4, "--results-file", tmp_path / "validation.csv", cwd=tmp_path)
    header, row = (tmp_path / "validation.csv").read_text().splitlines()
    result = dict(zip(header.split(","), row.split(",")))
    assert result["model"] == "sret_t" and 0.0 <= float(result["top1"]) <= 100.0

    _run_script(scripts / "benchmark.py", "--model", "sret_t", "--img-size", 64, "--batch-size", 2,
                "--bench", "both", "--num-warm-iter", 1, "--num-bench-iter", 5, "--device", "cpu",
                "--results-file", tmp_path / "benchmark.csv", cwd=tmp_path)
    header, row = (tmp_path / "benchmark.csv").read_text().splitlines()
    result = dict(zip(header.split(","), row.split(",")))
    assert float(result["infer_samples_per_sec"]) > 0 and float(result["train_samples_per_sec"]) > 0
    # --reparam: timm's reparameterize_model folds the LRC and the stem (our reparameterize hooks)
    _run_script(scripts / "benchmark.py", "--model", "sret_t", "--img-size", 64, "--batch-size", 2, "--reparam",
                "--bench", "inference", "--num-warm-iter", 1, "--num-bench-iter", 5, "--device", "cpu",
                "--results-file", tmp_path / "reparam.csv", cwd=tmp_path)
    header, row = (tmp_path / "reparam.csv").read_text().splitlines()
    assert float(dict(zip(header.split(","), row.split(",")))["infer_samples_per_sec"]) > 0
