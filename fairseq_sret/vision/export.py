"""ONNX export of the vision models (``pip install -e '.[onnx]'``: onnx, onnxscript, onnxruntime).

    from fairseq_sret.vision import create_model, export_onnx
    export_onnx(create_model("sret_t"), "sret_t.onnx")                  # input "images", output "logits"
    export_onnx(model, "sret_s_384.onnx", img_size=384, verify=True)    # + compare with ONNX Runtime

torch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``, torch >= 2.5) traces the
model in ``eval()`` mode - deterministic partitions, no dropout or stochastic depth - at one
image size with a dynamic batch dimension. The graph holds the sliced attention as it runs
in PyTorch (reshapes for contiguous and strided groups, index gathers where the tokens do
not divide into the groups). ``verify=True`` runs the file with
ONNX Runtime on a random batch and checks its logits against PyTorch's (default tolerance
1e-4, absolute and relative; docs/results/onnx.md has the differences measured).
"""

import inspect
from pathlib import Path
from typing import Optional, Tuple, Union

import torch
from torch import nn

#: the default tolerance of :func:`export_onnx`'s check (absolute and relative, on logits)
ONNX_TOLERANCE = 1e-4


def _image_size(model: nn.Module, img_size) -> Tuple[int, int]:
    if img_size is None:
        img_size = getattr(getattr(model, "cfg", None), "img_size", 224)
    return (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)


def export_onnx(
    model: nn.Module,
    path: Union[str, Path],
    img_size: Optional[Union[int, Tuple[int, int]]] = None,
    batch_size: int = 2,
    dynamic_batch: bool = True,
    opset_version: Optional[int] = None,
    verify: bool = False,
    tolerance: float = ONNX_TOLERANCE,
) -> Path:
    """Write ``model`` (an image classifier taking ``(B, C, H, W)``) to ``path`` as ONNX.

    ``img_size``: the input's height and width (default: the model's ``cfg.img_size``, else
    224). The example batch has ``batch_size`` images; with ``dynamic_batch`` the file takes
    any batch size. The model is exported in ``eval()`` mode and left in the mode it was in.
    ``verify``: check ONNX Runtime's logits against PyTorch's (``tolerance``, absolute and
    relative); raises ``AssertionError`` when they differ. Returns the path.
    """
    if "dynamo" not in inspect.signature(torch.onnx.export).parameters:
        raise RuntimeError(f"export_onnx needs torch >= 2.5 (dynamo=True export); this is torch {torch.__version__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    height, width = _image_size(model, img_size)
    in_chans = getattr(getattr(model, "cfg", None), "in_chans", 3)
    param = next(model.parameters(), None)
    example = torch.randn(batch_size, in_chans, height, width, generator=torch.Generator().manual_seed(0))
    if param is not None:
        example = example.to(device=param.device, dtype=param.dtype)
    was_training = model.training
    model.eval()
    try:
        kwargs = dict(input_names=["images"], output_names=["logits"], dynamo=True)
        if "external_data" in inspect.signature(torch.onnx.export).parameters:
            kwargs["external_data"] = False  # one self-contained file (the models are far below 2 GB)
        if dynamic_batch:
            kwargs["dynamic_shapes"] = ({0: torch.export.Dim("batch")},)
        if opset_version is not None:
            kwargs["opset_version"] = opset_version
        with torch.no_grad():
            torch.onnx.export(model, (example,), str(path), **kwargs)
        if verify:
            check_onnx(model, path, example, tolerance)
    finally:
        model.train(was_training)
    return path


def check_onnx(model: nn.Module, path: Union[str, Path], images: torch.Tensor, tolerance: float = ONNX_TOLERANCE) -> float:
    """Run ``path`` with ONNX Runtime (CPU) on ``images`` and compare with ``model(images)`` in
    eval mode; returns the largest absolute difference, raises ``AssertionError`` above
    ``tolerance`` (absolute and relative)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            expected = model(images).float().cpu()
    finally:
        model.train(was_training)
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: images.cpu().numpy()})[0])
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance,
                               msg=lambda m: f"ONNX Runtime's logits differ from PyTorch's: {m}")
    return float((got - expected).abs().max())
