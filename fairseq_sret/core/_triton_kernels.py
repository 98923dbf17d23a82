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
"""

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

# scale modes: 0 = none (1), 1 = one-element tensor (pointer), 2 = Python float (constant)
_NONE, _PTR, _CONST = 0, 1, 2


@triton.jit
def _lrc_norm_fwd_kernel(
    X, Y, RES, OUT, W, B, S, BS, s_const, b_const, MEAN, RSTD,
    M, N, eps,
    S_MODE: tl.constexpr, B_MODE: tl.constexpr, HAS_NORM: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    offs = rows[:, None].to(tl.int64) * N + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(ACC)
    y = tl.load(Y + offs, mask=mask, other=0.0).to(ACC)
    if S_MODE == 1:
        x = x * tl.load(S).to(ACC)
    elif S_MODE == 2:
        x = x * s_const
    if B_MODE == 1:
        y = y * tl.load(BS).to(ACC)
    elif B_MODE == 2:
        y = y * b_const
    r = (x + y).to(RES.dtype.element_ty)
    tl.store(RES + offs, r, mask=mask)
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
        tl.store(OUT + offs, out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _lrc_norm_bwd_kernel(
    X, Y, RES, DOUT, DRES, DX, DY, W, S, BS, s_const, b_const, MEAN, RSTD,
    DW, DBIAS, DS, DBS,
    M, N, rows_per_program,
    S_MODE: tl.constexpr, B_MODE: tl.constexpr, HAS_NORM: tl.constexpr, HAS_W: tl.constexpr,
    HAS_DRES: tl.constexpr, NEED_DX: tl.constexpr, NEED_DY: tl.constexpr, NEED_DS: tl.constexpr,
    NEED_DB: tl.constexpr, NEED_DW: tl.constexpr, NEED_DBIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    s = 1.0
    if S_MODE == 1:
        s = tl.load(S).to(ACC)
    elif S_MODE == 2:
        s = s_const
    b = 1.0
    if B_MODE == 1:
        b = tl.load(BS).to(ACC)
    elif B_MODE == 2:
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
        offs = rows[:, None].to(tl.int64) * N + cols[None, :]
        dr = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
        if HAS_NORM:
            r = tl.load(RES + offs, mask=mask, other=0.0).to(ACC)
            mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
            rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
            xhat = tl.where(mask, (r - mean[:, None]) * rstd[:, None], 0.0)
            dout = tl.load(DOUT + offs, mask=mask, other=0.0).to(ACC)
            if NEED_DW:
                dw_acc += tl.sum(dout * xhat, axis=0)
            if NEED_DBIAS:
                dbias_acc += tl.sum(dout, axis=0)
            wdy = dout * w[None, :]
            c1 = tl.sum(xhat * wdy, axis=1) / N
            c2 = tl.sum(wdy, axis=1) / N
            dr += (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        if HAS_DRES:
            dr += tl.load(DRES + offs, mask=mask, other=0.0).to(ACC)
        dr = tl.where(mask, dr, 0.0)
        if NEED_DX:
            tl.store(DX + offs, (dr * s).to(DX.dtype.element_ty), mask=mask)
        if NEED_DY:
            tl.store(DY + offs, (dr * b).to(DY.dtype.element_ty), mask=mask)
        if NEED_DS:
            x = tl.load(X + offs, mask=mask, other=0.0).to(ACC)
            ds_acc += tl.sum(dr * x, axis=1)
        if NEED_DB:
            y = tl.load(Y + offs, mask=mask, other=0.0).to(ACC)
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


def _mode(scale) -> int:
    if scale is None:
        return _NONE
    return _PTR if isinstance(scale, Tensor) else _CONST


class _LRCNorm(torch.autograd.Function):
    """(x, y, skip, branch, skip_const, branch_const, weight, bias, eps, norm, out_dtype) ->
    res, or (res, out) with ``norm``; the ``*_const`` are Python floats or None."""

    @staticmethod
    def forward(ctx, x, y, skip, branch, skip_const, branch_const, weight, bias, eps, norm, out_dtype):
        shape = x.shape
        n = shape[-1]
        x2 = x.contiguous().view(-1, n)
        y2 = y.contiguous().view(-1, n)
        m = x2.size(0)
        res_dtype = torch.promote_types(x.dtype, y.dtype)
        for t in (skip, branch):
            if t is not None:
                res_dtype = torch.promote_types(res_dtype, t.dtype)
        res = torch.empty((m, n), dtype=res_dtype, device=x.device)
        s = skip if skip is not None else skip_const
        b = branch if branch is not None else branch_const
        s_mode, b_mode = _mode(s), _mode(b)
        block_m, block_n, warps = _blocks(n)
        wide = torch.float64 in (x.dtype, y.dtype, res_dtype)  # float64 math for float64 inputs (gradcheck)
        acc = torch.float64 if wide else torch.float32
        dummy = x2
        if norm:
            out = torch.empty((m, n), dtype=out_dtype, device=x.device)
            mean = torch.empty(m, dtype=acc, device=x.device)
            rstd = torch.empty(m, dtype=acc, device=x.device)
        else:
            out = mean = rstd = dummy
        _lrc_norm_fwd_kernel[(triton.cdiv(m, block_m),)](
            x2, y2, res, out,
            weight if weight is not None else dummy, bias if bias is not None else dummy,
            skip if skip is not None else dummy, branch if branch is not None else dummy,
            float(skip_const) if skip_const is not None else 1.0,
            float(branch_const) if branch_const is not None else 1.0,
            mean, rstd, m, n, float(eps),
            S_MODE=s_mode, B_MODE=b_mode, HAS_NORM=norm, HAS_W=weight is not None, HAS_B=bias is not None,
            BLOCK_M=block_m, BLOCK_N=block_n, ACC=tl.float64 if wide else tl.float32, num_warps=warps,
        )
        need = ctx.needs_input_grad
        ctx.acc = acc
        ctx.norm, ctx.shape, ctx.modes = norm, shape, (s_mode, b_mode)
        ctx.consts = (skip_const, branch_const)
        ctx.dtypes = (x.dtype, y.dtype)
        ctx.has_w, ctx.has_b = weight is not None, bias is not None
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(
            x2 if need[2] else None, y2 if need[3] else None, res if norm else None,
            mean if norm else None, rstd if norm else None, weight, skip, branch,
        )
        if norm:
            return res.view(shape), out.view(shape)
        return res.view(shape)

    @staticmethod
    def backward(ctx, *grads):
        x2, y2, res, mean, rstd, weight, skip, branch = ctx.saved_tensors
        need = ctx.needs_input_grad
        norm = ctx.norm
        dres = grads[0]
        dout = grads[1] if norm else None
        has_norm = norm and dout is not None
        if dres is None and not has_norm:
            return (None,) * 11
        n = ctx.shape[-1]
        m = math.prod(ctx.shape[:-1])
        device = (dres if dres is not None else dout).device
        dres2 = dres.contiguous().view(-1, n) if dres is not None else None
        dout2 = dout.contiguous().view(-1, n) if has_norm else None
        need_dx, need_dy, need_ds, need_db = need[0], need[1], need[2], need[3]
        need_dw = has_norm and ctx.has_w and need[6]
        need_dbias = has_norm and ctx.has_b and need[7]
        block_m, block_n, warps = _blocks(n)
        tiles = triton.cdiv(m, block_m)
        if device.type == "cuda":
            programs = torch.cuda.get_device_properties(device).multi_processor_count * 4
        else:
            programs = 4
        programs = max(1, min(tiles, programs))
        rows_per_program = triton.cdiv(tiles, programs) * block_m
        programs = triton.cdiv(m, rows_per_program)
        f32 = ctx.acc
        dummy = dres2 if dres2 is not None else dout2
        dx = torch.empty((m, n), dtype=ctx.dtypes[0], device=device) if need_dx else dummy
        dy = torch.empty((m, n), dtype=ctx.dtypes[1], device=device) if need_dy else dummy
        dw = torch.empty((programs, n), dtype=f32, device=device) if need_dw else dummy
        dbias = torch.empty((programs, n), dtype=f32, device=device) if need_dbias else dummy
        ds = torch.empty(programs, dtype=f32, device=device) if need_ds else dummy
        dbs = torch.empty(programs, dtype=f32, device=device) if need_db else dummy
        skip_const, branch_const = ctx.consts
        s_mode, b_mode = ctx.modes
        _lrc_norm_bwd_kernel[(programs,)](
            x2 if x2 is not None else dummy, y2 if y2 is not None else dummy,
            res if has_norm else dummy, dout2 if has_norm else dummy, dres2 if dres2 is not None else dummy,
            dx, dy, weight if weight is not None else dummy,
            skip if skip is not None else dummy, branch if branch is not None else dummy,
            float(skip_const) if skip_const is not None else 1.0,
            float(branch_const) if branch_const is not None else 1.0,
            mean if has_norm else dummy, rstd if has_norm else dummy,
            dw, dbias, ds, dbs, m, n, rows_per_program,
            S_MODE=s_mode, B_MODE=b_mode, HAS_NORM=has_norm, HAS_W=weight is not None,
            HAS_DRES=dres2 is not None, NEED_DX=need_dx, NEED_DY=need_dy, NEED_DS=need_ds, NEED_DB=need_db,
            NEED_DW=need_dw, NEED_DBIAS=need_dbias, BLOCK_M=block_m, BLOCK_N=block_n,
            ACC=tl.float64 if f32 == torch.float64 else tl.float32, num_warps=warps,
        )
        shape = ctx.shape
        grad_x = dx.view(shape) if need_dx else None
        grad_y = dy.view(shape) if need_dy else None
        grad_s = ds.sum().reshape(skip.shape).to(skip.dtype) if need_ds else None
        grad_b = dbs.sum().reshape(branch.shape).to(branch.dtype) if need_db else None
        grad_w = dw.sum(0).to(weight.dtype) if need_dw else None
        grad_bias = dbias.sum(0).to(weight.dtype if weight is not None else f32) if need_dbias else None
        return grad_x, grad_y, grad_s, grad_b, None, None, grad_w, grad_bias, None, None, None


def lrc_add_norm_triton(
    x: Tensor, y: Tensor, skip_scale, branch_scale, weight: Optional[Tensor], bias: Optional[Tensor],
    eps: float, norm: bool,
):
    """``res`` (norm=False) or ``(res, out)``: see :mod:`fairseq_sret.core.fused`."""
    skip_t = skip_scale if isinstance(skip_scale, Tensor) else None
    branch_t = branch_scale if isinstance(branch_scale, Tensor) else None
    skip_c = None if skip_t is not None or skip_scale is None else float(skip_scale)
    branch_c = None if branch_t is not None or branch_scale is None else float(branch_scale)
    out_dtype = None
    if norm:
        res_dtype = torch.promote_types(x.dtype, y.dtype)
        for t in (skip_t, branch_t):
            if t is not None:
                res_dtype = torch.promote_types(res_dtype, t.dtype)
        out_dtype = torch.float32 if torch.is_autocast_enabled(x.device.type) else res_dtype
    return _LRCNorm.apply(x, y, skip_t, branch_t, skip_c, branch_c, weight, bias, eps, norm, out_dtype)
