import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

# OMP_NUM_THREADS, when set, wins: on a shared, contended machine two intra-op threads
# make small-tensor tests many times slower (each op waits for a descheduled thread).
torch.set_num_threads(int((os.environ.get("OMP_NUM_THREADS") or "").split(",")[0] or max(1, min(2, os.cpu_count() or 1))))

# The optional Triton kernels (fairseq_sret.core.fused) run under Triton's interpreter on a
# machine without CUDA; Triton reads the flag when it is first imported, so set it here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]

# The tests mirror the packages in folders (tests/core, tests/models, ...) and share helpers by
# module name (``from test_depth import sample_batch``): every folder is importable, and every
# test module's name is unique (tests/test_layers.py checks it).
for _folder in sorted(p for p in (REPO / "tests").rglob("*") if p.is_dir() and not p.name.startswith((".", "_"))):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))
SHARED = Path(os.environ.get("SRET_SHARED", REPO.parent / "shared"))

# fairseq is an extra ('.[fairseq]'): the core, vision and transformers tests run without it
# and the translation tests skip (whole modules with pytest.importorskip("fairseq")).
# SRET_REQUIRE_FAIRSEQ=1 (scripts/run_tests.sh's main job) makes a missing fairseq an error.
HAVE_FAIRSEQ = importlib.util.find_spec("fairseq") is not None
if not HAVE_FAIRSEQ and os.environ.get("SRET_REQUIRE_FAIRSEQ") == "1":
    raise pytest.UsageError("SRET_REQUIRE_FAIRSEQ=1 but fairseq is not installed (pip install -e '.[fairseq]')")
requires_fairseq = pytest.mark.skipif(not HAVE_FAIRSEQ, reason="needs fairseq (pip install -e '.[fairseq]')")


def shared_path(relative: str = "") -> Path:
    """``SHARED / relative``, the project's shared data; skips the calling test or fixture
    (module-scoped ones too) where it is not there."""
    path = SHARED / relative
    if not path.exists():
        pytest.skip(f"shared data {path} not present")
    return path


@pytest.fixture
def shared_dir():
    return shared_path()


@pytest.fixture(scope="module")
def single_thread():
    """One torch thread for a module of small-tensor tests (``pytestmark =
    pytest.mark.usefixtures("single_thread")``): two threads oversubscribe shared CPUs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
