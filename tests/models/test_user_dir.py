"""What ``--user-dir fairseq_sret`` loads: fairseq imports every module under ``models/``
(``fairseq.models.import_models``), so everything there must be something fairseq registers."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

LOAD = """
import argparse, json, sys
from fairseq import utils
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

before = set(sys.modules)
utils.import_user_module(argparse.Namespace(user_dir=sys.argv[1]))
registered = (
    [model.__module__ for model in ARCH_MODEL_REGISTRY.values()]
    + [arch.__module__ for arch in ARCH_CONFIG_REGISTRY.values()]
    + [criterion.__module__ for criterion in CRITERION_REGISTRY.values()]
)
print(json.dumps({
    "loaded": sorted(m for m in set(sys.modules) - before if m.split(".")[0] == "fairseq_sret"),
    "registered": sorted({m for m in registered if m.split(".")[0] == "fairseq_sret"}),
}))
"""


def package(module: str) -> str:
    """``fairseq_sret.models.sret_transformer.layers`` -> ``fairseq_sret.models.sret_transformer``."""
    return ".".join(module.split(".")[:3])


@pytest.mark.e2e
def test_user_dir_loads_only_what_fairseq_registers():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", LOAD, str(REPO / "fairseq_sret")], cwd=REPO.parent, env=env,
        capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    registering = {package(m) for m in result["registered"]}
    assert {"fairseq_sret.models.sret_transformer", "fairseq_sret.criterions.mixed_depth"} <= registering
    for module in result["loaded"]:
        if module.startswith(("fairseq_sret.models.", "fairseq_sret.criterions.")):
            assert package(module) in registering, f"{module} is loaded by --user-dir but registers nothing"
        else:  # the package, its fairseq fixes (and the patch mechanism), its atomic writes, the check
            # of the install (extras), the environment switches, a checkpoint's older depth words and the
            # pure-PyTorch building blocks
            assert module in {"fairseq_sret", "fairseq_sret.models", "fairseq_sret.criterions",
                              "fairseq_sret.fairseq_patches", "fairseq_sret.patching", "fairseq_sret.environment", "fairseq_sret.checkpoints",
                              "fairseq_sret.atomic_files", "fairseq_sret.extras", "fairseq_sret.depth_options"} \
                or module.startswith(("fairseq_sret.core", "fairseq_sret.fairseq_patches.")), \
                f"{module} is loaded by --user-dir"
