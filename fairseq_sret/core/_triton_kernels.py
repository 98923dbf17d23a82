"""Triton kernels of :mod:`fairseq_sret.core.fused` (imported only when Triton is installed).

``res = s * x + b * y`` and, optionally, ``out = LayerNorm(res)`` over the last dimension,
forward and backward, after FlashAttention's ``ops/triton/layer_norm.py`` (``prenorm=True``).
Differences: the two LRC scales (one-element tensors with gradients, or constants) take the
place of dropout/rowscale, and rows are processed in 2-D tiles of ``BLOCK_M`` rows, because
SReT's widths are small (64-512 channels) and one row per program would leave most lanes idle.

Forward: one kernel writes ``res`` (in the promoted dtype of x, y and the scales, like the
PyTorch expression) and ``out`` (float32 under autocast, like ``F.layer_norm``; else the
dtype of ``res``), plus the row mean and 1/std in float32 (float64 for float64 inputs, whose
arithmetic is then float64 throughout). The LayerNorm reads ``res`` after
rounding to its dtype, as the PyTorch path does.

Backward: one kernel per block of rows computes ``dres_total = LN_backward(dout) + dres``,
``dx = s * dres_total``, ``dy = b * dres_total``, and per-program partial sums of the
LayerNorm weight/bias gradients and of ``sum(dres_total * x)`` / ``sum(dres_total * y)``
(the gradients of the two scales); torch sums the partials (tiny tensors).

Inputs and incoming gradients are read through their row stride (any ``(..., N)`` tensor
whose leading dimensions flatten to one, e.g. a column slice, is used without a copy);
outputs are contiguous. Block sizes are fixed per width (:func:`_blocks`: tiles of about
2048 elements), not autotuned: autotuning runs every candidate on the first call of each
width, inside the first training step, and no GPU measurement here has compared candidates.

Forward and backward are ``torch.library.triton_op`` custom operators
(``fairseq_sret::lrc_add_norm`` and ``fairseq_sret::lrc_add_norm_backward``) with the
backward registered as the forward's autograd formula, so ``torch.compile`` keeps the
kernels in its graph instead of breaking it.
"""

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import register_autograd, triton_op, wrap_triton

# How a kernel reads an LRC scale (``S_MODE``/``B_MODE``).
SCALE_NONE = tl.constexpr(0)  # no scale: 1
SCALE_TENSOR = tl.constexpr(1)  # a one-element tensor (pointer), with a gradient
SCALE_CONST = tl.constexpr(2)  # a Python float


@triton.jit
def _lrc_norm_fwd_kernel(
    X, Y, RES, OUT, W, B, S, BS, s_const, b_const, MEAN, RSTD,
    stride_x_row, stride_y_row, stride_res_row, stride_out_row,
    M, N, eps,
    S_MODE: tl.constexpr, B_MODE: tl.constexpr, HAS_NORM: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WIDE: tl.constexpr,
):
    ACC = tl.float64 if WIDE else tl.float32  # float64 math for float64 inputs (gradcheck)
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    row = rows[:, None].to(tl.int64)
    x = tl.load(X + row * stride_x_row + cols[None, :], mask=mask, other=0.0).to(ACC)
    y = tl.load(Y + row * stride_y_row + cols[None, :], mask=mask, other=0.0).to(ACC)
    if S_MODE == SCALE_TENSOR:
        x = x * tl.load(S).to(ACC)
    elif S_MODE == SCALE_CONST:
        x = x * s_const
    if B_MODE == SCALE_TENSOR:
        y = y * tl.load(BS).to(ACC)
    elif B_MODE == SCALE_CONST:
        y = y * b_const
    r = (x + y).to(RES.dtype.element_ty)
    tl.store(RES + row * stride_res_row + cols[None, :], r, mask=mask)
    if HAS_NORM:
        r = r.to(ACC)
        mean = tl.sum(r, axis=1) / N
        xc = tl.where(mask, r - mean[:, None], 0.0)
        var = tl.sum(xc * xc, axis=1) / N
        rstd = 1.0 / tl.sqrt(var + eps)
        tl.store(MEAN + rows, mean, mask=rmask)
        tl.store(RSTD + rows, rstd, mask=rmask)
        out = xc * rstd[:, None]
        if HAS_W:
            out = out * tl.load(W + cols, mask=cmask, other=0.0).to(ACC)[None, :]
        if HAS_B:
            out = out + tl.load(B + cols, mask=cmask, other=0.0).to(ACC)[None, :]
        tl.store(OUT + row * stride_out_row + cols[None, :], out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _lrc_norm_bwd_kernel(
    X, Y, RES, DOUT, DRES, DX, DY, W, S, BS, s_const, b_const, MEAN, RSTD,
    DW, DBIAS, DS, DBS,
    stride_x_row, stride_y_row, stride_res_row, stride_dout_row, stride_dres_row, stride_dx_row, stride_dy_row,
    M, N, rows_per_program,
    S_MODE: tl.constexpr, B_MODE: tl.constexpr, HAS_NORM: tl.constexpr, HAS_W: tl.constexpr,
    HAS_DRES: tl.constexpr, NEED_DX: tl.constexpr, NEED_DY: tl.constexpr, NEED_DS: tl.constexpr,
    NEED_DB: tl.constexpr, NEED_DW: tl.constexpr, NEED_DBIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WIDE: tl.constexpr,
):
    ACC = tl.float64 if WIDE else tl.float32
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    s = 1.0
    if S_MODE == SCALE_TENSOR:
        s = tl.load(S).to(ACC)
    elif S_MODE == SCALE_CONST:
        s = s_const
    b = 1.0
    if B_MODE == SCALE_TENSOR:
        b = tl.load(BS).to(ACC)
    elif B_MODE == SCALE_CONST:
        b = b_const
    if HAS_NORM:
        if HAS_W:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(ACC)
        else:
            w = tl.where(cmask, 1.0, 0.0)
    dw_acc = tl.zeros((BLOCK_N,), dtype=ACC)
    dbias_acc = tl.zeros((BLOCK_N,), dtype=ACC)
    ds_acc = tl.zeros((BLOCK_M,), dtype=ACC)
    dbs_acc = tl.zeros((BLOCK_M,), dtype=ACC)
    row_start = pid * rows_per_program
    for i in range(0, rows_per_program, BLOCK_M):
        rows = row_start + i + tl.arange(0, BLOCK_M)
        rmask = rows < M
        mask = rmask[:, None] & cmask[None, :]
        row = rows[:, None].to(tl.int64)
        col = cols[None, :]
        dr = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
        if HAS_NORM:
            r = tl.load(RES + row * stride_res_row + col, mask=mask, other=0.0).to(ACC)
            mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
            rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
            xhat = tl.where(mask, (r - mean[:, None]) * rstd[:, None], 0.0)
            dout = tl.load(DOUT + row * stride_dout_row + col, mask=mask, other=0.0).to(ACC)
            if NEED_DW:
                dw_acc += tl.sum(dout * xhat, axis=0)
            if NEED_DBIAS:
                dbias_acc += tl.sum(dout, axis=0)
            wdy = dout * w[None, :]
            c1 = tl.sum(xhat * wdy, axis=1) / N
            c2 = tl.sum(wdy, axis=1) / N
            dr += (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        if HAS_DRES:
            dr += tl.load(DRES + row * stride_dres_row + col, mask=mask, other=0.0).to(ACC)
        dr = tl.where(mask, dr, 0.0)
        if NEED_DX:
            tl.store(DX + row * stride_dx_row + col, (dr * s).to(DX.dtype.element_ty), mask=mask)
        if NEED_DY:
            tl.store(DY + row * stride_dy_row + col, (dr * b).to(DY.dtype.element_ty), mask=mask)
        if NEED_DS:
            x = tl.load(X + row * stride_x_row + col, mask=mask, other=0.0).to(ACC)
            ds_acc += tl.sum(dr * x, axis=1)
        if NEED_DB:
            y = tl.load(Y + row * stride_y_row + col, mask=mask, other=0.0).to(ACC)
            dbs_acc += tl.sum(dr * y, axis=1)
    if NEED_DW:
        tl.store(DW + pid * N + cols, dw_acc, mask=cmask)
    if NEED_DBIAS:
        tl.store(DBIAS + pid * N + cols, dbias_acc, mask=cmask)
    if NEED_DS:
        tl.store(DS + pid, tl.sum(ds_acc, axis=0))
    if NEED_DB:
        tl.store(DBS + pid, tl.sum(dbs_acc, axis=0))


def _blocks(n: int):
    block_n = triton.next_power_of_2(n)
    block_m = max(1, min(64, 2048 // block_n))
    num_warps = 4 if block_m * block_n <= 4096 else 8
    return block_m, block_n, num_warps


def _scale_mode(tensor: Optional[Tensor], const: Optional[float]) -> int:
    if tensor is not None:
        return SCALE_TENSOR.value
    return SCALE_NONE.value if const is None else SCALE_CONST.value


def _rows(t: Tensor, n: int) -> Tensor:
    """``t`` (..., N) as (M, N) rows with unit column stride: a view, whatever its row
    stride, when the leading dimensions flatten to one; otherwise a copy."""
    t = t.reshape(-1, n)
    return t if t.stride(-1) == 1 else t.contiguous()


def _result_dtype(x: Tensor, y: Tensor, skip: Optional[Tensor], branch: Optional[Tensor]) -> torch.dtype:
    """The dtype of ``s * x + b * y`` in PyTorch (scales promote too)."""
    dtype = torch.promote_types(x.dtype, y.dtype)
    for t in (skip, branch):
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


@triton_op("fairseq_sret::lrc_add_norm", mutates_args=())
def lrc_add_norm_op(
    x: Tensor, y: Tensor, skip: Optional[Tensor], branch: Optional[Tensor],
    skip_const: Optional[float], branch_const: Optional[float],
    weight: Optional[Tensor], bias: Optional[Tensor], eps: float, norm: bool, out_dtype: torch.dtype,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """x, y: (..., N); a scale is a one-element tensor (``skip``/``branch``), a float
    (``*_const``) or neither (1). Returns ``res`` (M, N), and with ``norm`` the LayerNorm
    output ``out`` (M, N, ``out_dtype``) and the row ``mean`` and ``rstd`` (M,); without it,
    those three are empty."""
    n = x.shape[-1]
    x2, y2 = _rows(x, n), _rows(y, n)
    m = x2.shape[0]
    res_dtype = _result_dtype(x, y, skip, branch)
    wide = torch.float64 in (x.dtype, y.dtype, res_dtype)
    res = torch.empty((m, n), dtype=res_dtype, device=x.device)
    if norm:
        out = torch.empty((m, n), dtype=out_dtype, device=x.device)
        mean = torch.empty(m, dtype=torch.float64 if wide else torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
    else:
        out, mean, rstd = (res.new_empty(0) for _ in range(3))
    block_m, block_n, warps = _blocks(n)
    wrap_triton(_lrc_norm_fwd_kernel)[(triton.cdiv(m, block_m),)](
        x2, y2, res, out if norm else res,
        weight if weight is not None else res, bias if bias is not None else res,
        skip if skip is not None else res, branch if branch is not None else res,
        1.0 if skip_const is None else skip_const, 1.0 if branch_const is None else branch_const,
        mean if norm else res, rstd if norm else res,
        x2.stride(0), y2.stride(0), res.stride(0), out.stride(0) if norm else 0,
        m, n, eps,
        S_MODE=_scale_mode(skip, skip_const), B_MODE=_scale_mode(branch, branch_const), HAS_NORM=norm,
        HAS_W=weight is not None, HAS_B=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, WIDE=wide, num_warps=warps,
    )
    return res, out, mean, rstd


@triton_op("fairseq_sret::lrc_add_norm_backward", mutates_args=())
def lrc_add_norm_backward_op(
    dres: Optional[Tensor], dout: Optional[Tensor], x: Optional[Tensor], y: Optional[Tensor],
    res: Tensor, mean: Tensor, rstd: Tensor, weight: Optional[Tensor],
    skip: Optional[Tensor], branch: Optional[Tensor], skip_const: Optional[float], branch_const: Optional[float],
    x_dtype: torch.dtype, y_dtype: torch.dtype, need_dx: bool, need_dy: bool, need_dw: bool, need_dbias: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of :func:`lrc_add_norm_op` from ``dres`` and ``dout`` (either may be None;
    ``dout`` None: no LayerNorm). ``x``/``y`` are given when the gradient of ``skip``/``branch``
    is needed. Returns ``dx``, ``dy`` (M, N), ``dskip``, ``dbranch`` (one element, float32 or
    float64), ``dweight``, ``dbias`` (N); those not asked for are empty."""
    n = res.shape[-1]
    m = res.shape[0]
    has_norm = dout is not None
    need_dw, need_dbias = need_dw and has_norm, need_dbias and has_norm
    need_ds, need_db = x is not None and skip is not None, y is not None and branch is not None
    dres2 = _rows(dres, n) if dres is not None else None
    dout2 = _rows(dout, n) if has_norm else None
    x2 = _rows(x, n) if need_ds else None
    y2 = _rows(y, n) if need_db else None
    block_m, block_n, warps = _blocks(n)
    tiles = triton.cdiv(m, block_m)
    # enough programs to fill the device, each summing its rows' parameter gradients
    if res.device.type == "cuda":
        programs = torch.cuda.get_device_properties(res.device).multi_processor_count * 4
    else:
        programs = 4
    programs = max(1, min(tiles, programs))
    rows_per_program = triton.cdiv(tiles, programs) * block_m
    programs = triton.cdiv(m, rows_per_program)
    wide = mean.dtype == torch.float64 or torch.float64 in (x_dtype, y_dtype, res.dtype)
    acc = torch.float64 if wide else torch.float32

    def empty():
        return res.new_empty(0)

    dx = torch.empty((m, n), dtype=x_dtype, device=res.device) if need_dx else empty()
    dy = torch.empty((m, n), dtype=y_dtype, device=res.device) if need_dy else empty()
    dw = torch.empty((programs, n), dtype=acc, device=res.device) if need_dw else empty()
    dbias = torch.empty((programs, n), dtype=acc, device=res.device) if need_dbias else empty()
    ds = torch.empty(programs, dtype=acc, device=res.device) if need_ds else empty()
    dbs = torch.empty(programs, dtype=acc, device=res.device) if need_db else empty()
    wrap_triton(_lrc_norm_bwd_kernel)[(programs,)](
        x2 if need_ds else res, y2 if need_db else res, res,
        dout2 if has_norm else res, dres2 if dres2 is not None else res,
        dx, dy, weight if weight is not None else res,
        skip if skip is not None else res, branch if branch is not None else res,
        1.0 if skip_const is None else skip_const, 1.0 if branch_const is None else branch_const,
        mean, rstd, dw, dbias, ds, dbs,
        x2.stride(0) if need_ds else 0, y2.stride(0) if need_db else 0, res.stride(0),
        dout2.stride(0) if has_norm else 0, dres2.stride(0) if dres2 is not None else 0,
        dx.stride(0) if need_dx else 0, dy.stride(0) if need_dy else 0,
        m, n, rows_per_program,
        S_MODE=_scale_mode(skip, skip_const), B_MODE=_scale_mode(branch, branch_const), HAS_NORM=has_norm,
        HAS_W=weight is not None, HAS_DRES=dres2 is not None, NEED_DX=need_dx, NEED_DY=need_dy,
        NEED_DS=need_ds, NEED_DB=need_db, NEED_DW=need_dw, NEED_DBIAS=need_dbias,
        BLOCK_M=block_m, BLOCK_N=block_n, WIDE=wide, num_warps=warps,
    )
    return (
        dx, dy, ds.sum().reshape(1) if need_ds else empty(), dbs.sum().reshape(1) if need_db else empty(),
        dw.sum(0) if need_dw else empty(), dbias.sum(0) if need_dbias else empty(),
    )


def _setup_context(ctx, inputs, output) -> None:
    x, y, skip, branch, skip_const, branch_const, weight, bias, _eps, norm, _out_dtype = inputs
    res, _out, mean, rstd = output
    need = ctx.needs_input_grad
    ctx.save_for_backward(
        x if need[2] else None, y if need[3] else None, res, mean, rstd, weight, skip, branch, bias,
    )
    ctx.consts = (skip_const, branch_const)
    ctx.norm = norm
    ctx.shape = x.shape
    ctx.dtypes = (x.dtype, y.dtype)
    ctx.mark_non_differentiable(mean, rstd)
    ctx.set_materialize_grads(False)


def _backward(ctx, dres, dout, _dmean, _drstd):
    x, y, res, mean, rstd, weight, skip, branch, bias = ctx.saved_tensors
    need = ctx.needs_input_grad
    if not ctx.norm:
        dout = None
    if dres is None and dout is None:
        return (None,) * 11
    dx, dy, ds, db, dw, dbias = lrc_add_norm_backward_op(
        dres, dout, x, y, res, mean, rstd, weight, skip, branch, *ctx.consts, *ctx.dtypes,
        need[0], need[1], need[6], need[7],
    )
    has_norm = dout is not None
    return (
        dx.view(ctx.shape) if need[0] else None,
        dy.view(ctx.shape) if need[1] else None,
        ds.reshape(skip.shape).to(skip.dtype) if need[2] else None,
        db.reshape(branch.shape).to(branch.dtype) if need[3] else None,
        None, None,
        dw.to(weight.dtype) if need[6] and has_norm else None,
        dbias.to(bias.dtype) if need[7] and has_norm else None,
        None, None, None,
    )


register_autograd("fairseq_sret::lrc_add_norm", _backward, setup_context=_setup_context)


def lrc_add_norm_triton(
    x: Tensor, y: Tensor, skip_scale, branch_scale, weight: Optional[Tensor], bias: Optional[Tensor],
    eps: float, norm: bool,
):
    """``res`` (norm=False) or ``(res, out)`` in the shape of ``x``: see :mod:`fairseq_sret.core.fused`.
    A scale is a one-element tensor, a Python float or None."""
    skip = skip_scale if isinstance(skip_scale, Tensor) else None
    branch = branch_scale if isinstance(branch_scale, Tensor) else None
    skip_const = None if skip is not None or skip_scale is None else float(skip_scale)
    branch_const = None if branch is not None or branch_scale is None else float(branch_scale)
    res_dtype = _result_dtype(x, y, skip, branch)
    out_dtype = torch.float32 if norm and torch.is_autocast_enabled(x.device.type) else res_dtype
    res, out, _, _ = lrc_add_norm_op(
        x, y, skip, branch, skip_const, branch_const, weight, bias, float(eps), norm, out_dtype
    )
    if norm:
        return res.view(x.shape), out.view(x.shape)
    return res.view(x.shape)
