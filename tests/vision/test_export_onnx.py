"""ONNX export of the vision models (fairseq_sret.vision.export_onnx).

torch.onnx.export(..., dynamo=True) of SReT-T and SReT-S in eval mode, with a
dynamic batch dimension; ONNX Runtime's logits equal PyTorch's within 1e-4 (absolute and
relative) for batches of 1 and 3. The weights are randomised, BatchNorm statistics and LRC
coefficients included, so that every part of the graph matters. onnx, onnxscript and
onnxruntime are optional (``pip install -e '.[onnx]'``): the tests skip, saying so, when
they are absent.
"""

import importlib.util
import inspect

import pytest
import torch

from benchmarks.bench_onnx import randomised  # noqa: F401  (also imported from here by other tests)
from fairseq_sret.vision import check_onnx, export_onnx

MISSING = [m for m in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(m) is None]
pytestmark = [
    # an export takes 5-25 s of CPU: out of the quick tier; CI (run_tests.sh) runs every tier
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"ONNX export needs {', '.join(MISSING)} (pip install -e '.[onnx]')"),
    pytest.mark.skipif("dynamo" not in inspect.signature(torch.onnx.export).parameters,
                       reason=f"ONNX export needs torch >= 2.5 (dynamo exporter), this is {torch.__version__}"),
]


@pytest.mark.parametrize("name", ["sret_t", "sret_s"])
def test_onnx_runtime_matches_pytorch(name, tmp_path):
    model = randomised(name).train()  # exported in eval mode, left as it was
    path = export_onnx(model, tmp_path / f"{name}.onnx")
    assert model.training and path.stat().st_size > 4 * sum(p.numel() for p in model.parameters())
    for batch in (1, 3):  # the batch dimension is dynamic
        images = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(batch))
        assert check_onnx(model, path, images) <= 1e-4


def test_onnx_export_of_other_sizes_and_uneven_groups_with_its_check(tmp_path):
    """A one-block-per-stage SReT (a small graph, seconds) at 96x96, where 144 tokens in 5
    groups take the gather path of the sliced attention instead of reshapes."""
    model = randomised("sret_t", blocks=(1, 1, 1), img_size=96, num_classes=10, groups=((5, 2), (3, 1), (1, 1)))
    path = export_onnx(model, tmp_path / "small.onnx", verify=True, dynamic_batch=False, batch_size=1)
    assert check_onnx(model, path, torch.randn(1, 3, 96, 96)) <= 1e-4
