"""Residual + LRC (+ LayerNorm) as one operation: the PyTorch path against its definition
(gradcheck in float64), and the Triton kernel against the PyTorch path.

The Triton tests run the real kernels on a CUDA device, or on the CPU under Triton's
interpreter (``TRITON_INTERPRET=1``, set by conftest.py before Triton is first imported);
they are skipped when Triton is not installed (``pip install -e .[kernels]``).
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from fairseq_sret.core import FoldedResidual, LearnableResidual, NonLinearProjection, Recursive, SReTBlock, config, fused
from fairseq_sret.core.config import fast_paths
from fairseq_sret.core.fused import lrc_add, lrc_add_norm, lrc_add_norm_ref, lrc_add_ref

HAVE_TRITON = importlib.util.find_spec("triton") is not None
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _scale(kind, value, dtype=torch.float64, device="cpu", grad=True):
    if kind == "tensor":
        return torch.tensor([value], dtype=dtype, device=device, requires_grad=grad)
    return value if kind == "const" else None


SCALE_KINDS = [("tensor", "tensor"), ("const", None), (None, None), ("const", "const"), ("tensor", None)]


# ----------------------------------------------------------------------------- PyTorch path
@pytest.mark.parametrize("skip_kind,branch_kind", SCALE_KINDS)
def test_lrc_add_is_its_definition(skip_kind, branch_kind):
    torch.manual_seed(0)
    x, y = torch.randn(4, 7, 16, dtype=torch.float64), torch.randn(4, 7, 16, dtype=torch.float64)
    s, b = _scale(skip_kind, 0.7, grad=False), _scale(branch_kind, -1.3, grad=False)
    # float64: the one-kernel form rounds the product-sum once instead of twice
    torch.testing.assert_close(lrc_add(x, y, s, b), lrc_add_ref(x, y, s, b), rtol=1e-15, atol=1e-15)
    x32, y32 = x.float(), y.float()
    s32 = s.float() if isinstance(s, torch.Tensor) else s
    b32 = b.float() if isinstance(b, torch.Tensor) else b
    # float32: within one rounding of the three-kernel expression
    torch.testing.assert_close(lrc_add(x32, y32, s32, b32), lrc_add_ref(x32, y32, s32, b32), rtol=2e-7, atol=1e-6)


def test_lrc_one_op_switch_restores_the_three_kernel_expression():
    torch.manual_seed(0)
    lrc = LearnableResidual(True)
    with torch.no_grad():
        lrc.skip_scale.fill_(0.3)
        lrc.branch_scale.fill_(1.7)
    x, y = torch.randn(3, 5, 16), torch.randn(3, 5, 16)
    with fast_paths(lrc_one_op=False):
        assert torch.equal(lrc(x, y), lrc.skip_scale * x + lrc.branch_scale * y)
    assert config.get_fast_paths().lrc_one_op
    with pytest.raises(ValueError, match="fused"):
        config.set_fast_paths(fused="sometimes")


def test_lrc_one_op_counts_two_kernels_not_three():
    from torch.profiler import ProfilerActivity, profile

    lrc = LearnableResidual(True)
    x, y = torch.randn(64, 16), torch.randn(64, 16)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        lrc(x, y)
    ops = [e.key for e in prof.key_averages() if e.key in ("aten::mul", "aten::add", "aten::addcmul")]
    assert sorted(ops) == ["aten::addcmul", "aten::mul"], ops


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("one_op", ["auto", True, False])
def test_lrc_backward_per_device(device, one_op):
    """The lean backward (_LRCAdd) runs for CPU tensors, and for others only with
    lrc_one_op=True; by default ("auto") a non-CPU tensor that needs gradients takes the
    three-kernel expression (the meta device stands in for CUDA: same dispatch, no data)."""
    lrc = LearnableResidual(True).to(device)
    x, y = torch.randn(3, 5, 16, device=device), torch.randn(3, 5, 16, device=device)
    with fast_paths(lrc_one_op=one_op):
        out = lrc(x, y)
        with torch.no_grad():
            inference = lrc(x, y)
    lean = one_op is True or (one_op == "auto" and device == "cpu")
    assert (type(out.grad_fn).__name__ == "_LRCAddBackward") == lean, out.grad_fn
    if one_op is False:
        assert type(out.grad_fn).__name__ == "AddBackward0"
    else:
        assert type(out.grad_fn).__name__ in ("_LRCAddBackward", "AddBackward0")
    assert inference.grad_fn is None and inference.shape == x.shape
    if device == "cpu":
        torch.testing.assert_close(out, lrc.skip_scale * x + lrc.branch_scale * y, rtol=2e-7, atol=1e-6)


def test_lrc_one_op_refuses_unknown_values():
    with pytest.raises(ValueError, match="lrc_one_op"):
        config.set_fast_paths(lrc_one_op="sometimes")
    assert config.get_fast_paths().lrc_one_op == "auto"


@pytest.mark.parametrize("skip_kind,branch_kind", SCALE_KINDS)
def test_gradcheck_pytorch_path(skip_kind, branch_kind):
    torch.manual_seed(0)
    x = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    norm = nn.LayerNorm(6).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    s, b = _scale(skip_kind, 0.7), _scale(branch_kind, -1.3)
    leaves = [t for t in (x, y, s, b, norm.weight, norm.bias) if isinstance(t, torch.Tensor)]

    def fn(*_):
        res, out = lrc_add_norm(x, y, s, b, norm)
        return res, out, lrc_add(x, y, s, b)

    with fast_paths(fused="off"):
        assert torch.autograd.gradcheck(fn, tuple(leaves))
        res, out = lrc_add_norm(x, y, s, b, norm)
    ref_res, ref_out = lrc_add_norm_ref(x, y, s, b, norm.weight, norm.bias, norm.eps)
    torch.testing.assert_close(res, ref_res, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(out, ref_out, rtol=1e-13, atol=1e-13)


def test_forward_norm_of_residual_modules():
    torch.manual_seed(0)
    norm = nn.LayerNorm(8)
    x, y = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    for res in (LearnableResidual(True), LearnableResidual(False), FoldedResidual(0.5), FoldedResidual(1.0)):
        out, normed = res.forward_norm(x, y, norm)
        assert torch.equal(out, res(x, y)) and torch.equal(normed, norm(out))
    assert torch.allclose(FoldedResidual(0.5)(x, y), 0.5 * x + y) and torch.equal(FoldedResidual(1.0)(x, y), x + y)


# ----------------------------------------------------------------------------- Triton kernel
@pytest.fixture
def triton_kernels():
    if not HAVE_TRITON:
        pytest.skip("Triton not installed (pip install -e .[kernels]); the kernel is optional")
    fused.triton_available.cache_clear()
    if not fused.triton_available():
        pytest.skip("Triton installed but not usable here")
    from fairseq_sret.core import _triton_kernels

    if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA and TRITON_INTERPRET is not 1 (conftest.py sets it)")
    yield _triton_kernels
    fused.triton_available.cache_clear()


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("skip_kind,branch_kind", SCALE_KINDS)
@pytest.mark.parametrize("shape", [(3, 5, 24), (70, 64)])
def test_triton_kernel_matches_reference(triton_kernels, norm, skip_kind, branch_kind, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, device=DEVICE, requires_grad=True)
    y = torch.randn(shape, device=DEVICE, requires_grad=True)
    s = _scale(skip_kind, 0.7, torch.float32, DEVICE)
    b = _scale(branch_kind, -1.3, torch.float32, DEVICE)
    n = shape[-1]
    w = torch.randn(n, device=DEVICE, requires_grad=True)
    bias = torch.randn(n, device=DEVICE, requires_grad=True)
    leaves = [t for t in (x, y, s, b) + ((w, bias) if norm else ()) if isinstance(t, torch.Tensor)]
    if norm:
        got = triton_kernels.lrc_add_norm_triton(x, y, s, b, w, bias, 1e-5, norm=True)
        want = lrc_add_norm_ref(x, y, s, b, w, bias, 1e-5)
    else:
        got = (triton_kernels.lrc_add_norm_triton(x, y, s, b, None, None, 0.0, norm=False),)
        want = (lrc_add_ref(x, y, s, b),)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    grads_out = [torch.randn_like(r) for r in want]
    got_grads = torch.autograd.grad(got, leaves, grads_out)
    want_grads = torch.autograd.grad(want, leaves, grads_out)
    for g, r in zip(got_grads, want_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4 * max(1.0, r.abs().max().item()))


def _strided_rows(batch, length, width, device):
    """A (batch, length, width) view with row stride > width: the kernels read it in place."""
    return torch.randn(batch, length, width + 3, device=device)[..., :width]


def _transposed(batch, length, width, device):
    """A (batch, length, width) view of a (length, batch, width) tensor (fairseq's layout):
    its rows do not flatten to one stride, so the kernels read a copy."""
    return torch.randn(length, batch, width, device=device).transpose(0, 1)


@pytest.mark.parametrize("width", [1, 40, 1000, fused.MAX_FUSED_WIDTH])
def test_triton_kernel_widths_and_strided_inputs(triton_kernels, width):
    """Every width up to the widest the dispatch sends to the kernel, with inputs and incoming
    gradients that are not contiguous (a column slice, fairseq's transposed layout)."""
    torch.manual_seed(0)
    x = _strided_rows(2, 3, width, DEVICE).requires_grad_()
    y = _transposed(2, 3, width, DEVICE).requires_grad_()
    assert not x.is_contiguous() and not y.is_contiguous()
    assert triton_kernels._rows(x, width).data_ptr() == x.data_ptr()  # read in place, no copy
    s = torch.tensor([0.7], device=DEVICE, requires_grad=True)
    w = torch.randn(width, device=DEVICE, requires_grad=True)
    bias = torch.randn(width, device=DEVICE, requires_grad=True)
    got = triton_kernels.lrc_add_norm_triton(x, y, s, -1.3, w, bias, 1e-5, norm=True)
    want = lrc_add_norm_ref(x, y, s, -1.3, w, bias, 1e-5)
    for g, r in zip(got, want):
        assert g.shape == r.shape and g.is_contiguous()
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    grads_out = (_transposed(2, 3, width, DEVICE), _strided_rows(2, 3, width, DEVICE))
    leaves = (x, y, s, w, bias)
    for g, r in zip(torch.autograd.grad(got, leaves, grads_out), torch.autograd.grad(want, leaves, grads_out)):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4 * max(1.0, r.abs().max().item()))
    with fast_paths(fused="force"):
        assert fused._use_triton(x, y)
        assert not fused._use_triton(_strided_rows(1, 1, fused.MAX_FUSED_WIDTH + 1, DEVICE),
                                     _strided_rows(1, 1, fused.MAX_FUSED_WIDTH + 1, DEVICE))


@pytest.mark.e2e
@pytest.mark.skipif(not HAVE_TRITON, reason="Triton not installed (pip install -e .[kernels])")
def test_torch_compile_keeps_the_kernel_as_one_operator():
    """Traced by torch.compile (fullgraph), the fused path is the ``fairseq_sret::lrc_add_norm``
    operator with the kernel's output shapes, and its backward operator traces with fake
    tensors. A fresh process without the interpreter: traced kernels are compiled Triton
    functions, never launched here."""
    script = textwrap.dedent('''
        import torch
        from torch import nn
        from torch._subclasses.fake_tensor import FakeTensorMode
        from fairseq_sret.core import _triton_kernels as kernels, fused
        from fairseq_sret.core.config import fast_paths

        x, y = torch.randn(2, 3, 16, requires_grad=True), torch.randn(2, 3, 16, requires_grad=True)
        s, norm = torch.tensor([0.7], requires_grad=True), nn.LayerNorm(16)
        graphs = []

        def record(gm, inputs):
            graphs.append(gm)
            return lambda *args: fused.lrc_add_norm_ref(x, y, s, 0.5, norm.weight, norm.bias, norm.eps)

        fused._KERNEL_OK[("cpu", None)] = True  # the eager check runs on a GPU or the interpreter
        with fast_paths(fused="force"):
            torch.compile(lambda x, y: fused.lrc_add_norm(x, y, s, 0.5, norm), backend=record, fullgraph=True)(x, y)
        calls = [n for n in graphs[0].graph.nodes if n.op == "call_function"]
        assert str(calls[0].target) == "fairseq_sret.lrc_add_norm.default", calls
        res, out, mean, rstd = calls[0].meta["example_value"]
        assert res.shape == out.shape == (6, 16) and mean.shape == rstd.shape == (6,)
        with FakeTensorMode():
            g = torch.empty(6, 16)
            dx, dy, ds, db, dw, dbias = kernels.lrc_add_norm_backward_op(
                g, g, torch.empty(6, 16), None, torch.empty(6, 16), torch.empty(6), torch.empty(6),
                torch.empty(16), torch.empty(1), None, None, 0.5, torch.float32, torch.float32,
                True, True, True, True)
            assert dx.shape == dy.shape == (6, 16) and ds.shape == (1,) and db.numel() == 0
            assert dw.shape == dbias.shape == (16,)
        print("kept")
    ''')
    env = dict(os.environ, TRITON_INTERPRET="0", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "kept" in done.stdout, done.stderr[-3000:]


@pytest.mark.skipif(not CUDA, reason="Inductor compiles the kernel on a CUDA device only")
def test_compiled_kernel_matches_eager_on_cuda(triton_kernels):
    torch.manual_seed(0)
    x, y = (torch.randn(4, 7, 64, device="cuda", requires_grad=True) for _ in range(2))
    s = torch.tensor([0.7], device="cuda", requires_grad=True)
    norm = nn.LayerNorm(64).cuda()

    def step(x, y):
        res, out = lrc_add_norm(x, y, s, -1.3, norm)
        return res.square().sum() + out.sum()

    leaves = (x, y, s, norm.weight, norm.bias)
    with fast_paths(fused="force"):
        want = torch.autograd.grad(step(x, y), leaves)  # eager, runs the one-time check
        got = torch.autograd.grad(torch.compile(step, fullgraph=True)(x, y), leaves)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # ~7 s through the Triton interpreter on a CPU
def test_triton_kernel_gradcheck_float64(triton_kernels):
    torch.manual_seed(0)
    x = torch.randn(5, 12, dtype=torch.float64, device=DEVICE, requires_grad=True)
    y = torch.randn(5, 12, dtype=torch.float64, device=DEVICE, requires_grad=True)
    s = torch.tensor([0.7], dtype=torch.float64, device=DEVICE, requires_grad=True)
    b = torch.tensor([-1.3], dtype=torch.float64, device=DEVICE, requires_grad=True)
    w = torch.randn(12, dtype=torch.float64, device=DEVICE, requires_grad=True)
    bias = torch.randn(12, dtype=torch.float64, device=DEVICE, requires_grad=True)

    def fn(x, y, s, b, w, bias):
        res, out = triton_kernels.lrc_add_norm_triton(x, y, s, b, w, bias, 1e-5, norm=True)
        return res, out, triton_kernels.lrc_add_norm_triton(x, y, s, b, None, None, 0.0, norm=False)

    assert torch.autograd.gradcheck(fn, (x, y, s, b, w, bias))


def test_triton_mixed_dtypes_follow_pytorch_promotion(triton_kernels):
    torch.manual_seed(0)
    x = torch.randn(6, 32, device=DEVICE)  # float32 residual stream
    y = torch.randn(6, 32, device=DEVICE).bfloat16()  # half-precision branch
    s, b = torch.tensor([0.9], device=DEVICE), torch.tensor([1.1], device=DEVICE)
    norm = nn.LayerNorm(32).to(DEVICE)
    with fast_paths(fused="force"):
        res, out = lrc_add_norm(x, y, s, b, norm)
    ref_res, ref_out = lrc_add_norm_ref(x, y, s, b, norm.weight, norm.bias, norm.eps)
    assert res.dtype == ref_res.dtype == torch.float32 and out.dtype == ref_out.dtype
    torch.testing.assert_close(res, ref_res)
    torch.testing.assert_close(out, ref_out)


def _small_stack():
    torch.manual_seed(0)
    block = SReTBlock(16, 2, 24, groups=(2, 1), partition=("contiguous", "random"), drop_path=0.0)
    model = Recursive(block, 2, make_nll=lambda i: NonLinearProjection(16, 0.5))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("skip_scale", "branch_scale")):
                p.uniform_(0.5, 1.5)
    return model.to(DEVICE)


def test_recursive_chains_layernorms_through_the_kernel(triton_kernels):
    """Pre-LN block + NLL applications chained through the fused kernel equal the plain path."""
    model = _small_stack()
    x = torch.randn(2, 8, 16, device=DEVICE)
    model.eval()
    assert not model._chains_norms(x) or CUDA  # CPU tensors: only when forced
    with fast_paths(fused="force"):
        assert model._chains_norms(x)
        got = model(x)
    with fast_paths(fused="off"):
        want = model(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    model.train()
    grads = []
    for mode in ("off", "force"):
        model.zero_grad()
        torch.manual_seed(1)  # the same random partition in both runs
        with fast_paths(fused=mode):
            model(x).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        scale = max(1.0, grads[0][name].abs().max().item())
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_kernel_not_used_with_hooks_or_unchecked_under_compile_or_export(triton_kernels, monkeypatch):
    norm = nn.LayerNorm(8).to(DEVICE)
    x = torch.randn(4, 8, device=DEVICE)
    with fast_paths(fused="force"):
        assert fused._use_triton(x, x, norm)
        handle = norm.register_forward_hook(lambda *a: None)
        assert not fused._use_triton(x, x, norm)
        handle.remove()
        # traced: the kernel only after its eager check passed on the device, never exported
        monkeypatch.setattr(fused, "is_compiling", lambda: True)
        assert fused._use_triton(x, x, norm)
        monkeypatch.setattr(fused, "is_exporting", lambda: True)
        assert not fused._use_triton(x, x, norm)
        monkeypatch.setattr(fused, "is_exporting", lambda: False)
        monkeypatch.setattr(fused, "_KERNEL_OK", {})
        assert not fused._use_triton(x, x, norm)
    with fast_paths(fused="off"):
        assert not fused._use_triton(x, x, norm)
    assert os.environ.get("SRET_DISABLE_TRITON", "0") != "1"


def test_auto_mode_keeps_the_kernel_for_graph_capture_and_compile_not_eager(triton_kernels, monkeypatch):
    # the tensors stand in for CUDA ones: "auto" and "on" differ only in eager mode
    monkeypatch.setattr(fused, "_kernel_device", lambda x, mode: mode != "off")
    monkeypatch.setattr(fused, "_KERNEL_OK", {})
    norm = nn.LayerNorm(8).to(DEVICE)
    x = torch.randn(4, 8, device=DEVICE)
    key = (x.device.type, x.device.index)
    with fast_paths(fused="auto"):
        assert not fused._use_triton(x, x, norm)
        assert fused._KERNEL_OK[key]  # checked in eager, so a later capture or compile may use it
        monkeypatch.setattr(fused, "is_capturing_cuda_graph", lambda device: True)
        assert fused._use_triton(x, x, norm)
        monkeypatch.setattr(fused, "is_capturing_cuda_graph", lambda device: False)
        monkeypatch.setattr(fused, "is_compiling", lambda: True)
        assert fused._use_triton(x, x, norm)
        monkeypatch.setattr(fused, "is_compiling", lambda: False)
        res, out = lrc_add_norm(x, x, 0.5, None, norm)  # eager: the PyTorch path, exactly
        assert torch.equal(res, 0.5 * x + x) and torch.equal(out, norm(0.5 * x + x))
    with fast_paths(fused="on"):
        assert fused._use_triton(x, x, norm)


def test_broken_kernel_falls_back_to_pytorch_with_a_warning(triton_kernels, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no such device function")

    monkeypatch.setattr(triton_kernels, "lrc_add_norm_triton", broken)
    monkeypatch.setattr(fused, "_KERNEL_OK", {})
    x = torch.randn(4, 8, device=DEVICE)
    norm = nn.LayerNorm(8).to(DEVICE)
    with fast_paths(fused="force"), pytest.warns(UserWarning, match="using PyTorch"):
        res, out = lrc_add_norm(x, x, 0.5, None, norm)
    torch.testing.assert_close(out, norm(0.5 * x + x))
