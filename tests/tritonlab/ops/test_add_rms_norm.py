"""add_rms_norm (the residual add fused into the RMSNorm after it) and rms_norm's weight-gradient
partial sums, in the Triton interpreter against float64 references.

Every ``torch.empty`` is poisoned here (conftest), so s, y, either input gradient or a partial sum an
output element of which a kernel forgets to write shows up as NaN. Tolerances as in test_ops: 1e-5
for float32 results, 2e-3 for float16 ones (11 significant bits).
"""

import itertools
import json
import sys

import pytest
import torch
import triton

from tritonlab.ops import add_rms_norm
from tritonlab.testing import rel_err, run_without_interpreter, triton_tools_missing

F32, F16 = torch.float32, torch.float16
TOL = {F32: 1e-5, F16: 2e-3}
ROWS, WIDTHS = (1, 7, 129), (1, 123, 1500)
# (x's dtype, the residual's, out_dtype): one dtype; the LM under autocast (a float32 stream, a
# half-precision branch output, the norm written in half precision for the next matmul).
DTYPES = [(F32, F32, None), (F16, F16, None), (F32, F16, F16)]


def rms_norm_ref(s, w, eps=1e-6):
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def f64(t):
    return t.detach().double().requires_grad_()


def _inputs(shape, x_dtype, r_dtype, weight=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(x_dtype).requires_grad_()
    r = (0.5 * torch.randn(shape, generator=g)).to(r_dtype).requires_grad_()
    w = (1 + 0.3 * torch.randn(shape[-1], generator=g)).to(x_dtype).requires_grad_() if weight else None
    return x, r, w


def _reference(x, r, w, ds, dy):
    """float64 s, y and the gradients of x, r, w for the upstream (ds, dy) (ds None: y alone)."""
    xr, rr = f64(x), f64(r)
    wr = None if w is None else f64(w)
    s = xr + rr
    y = rms_norm_ref(s, wr)
    inputs = [xr, rr] + ([] if wr is None else [wr])
    if ds is None:
        grads = torch.autograd.grad(y, inputs, dy.double())
    else:
        grads = torch.autograd.grad((s, y), inputs, (ds.double(), dy.double()))
    return s, y, grads


def _dx_terms(s, w, dy, ds):
    """The size of g's terms: at width 1 the norm's two cancel exactly, leaving ds (or nothing)."""
    rstd = s.detach().double().pow(2).mean(-1, keepdim=True).rsqrt()
    terms = (dy.double() * (1.0 if w is None else w.detach().double()) * rstd).norm().item()
    return terms + (0.0 if ds is None else ds.double().norm().item())


@pytest.mark.parametrize("with_ds", [False, True], ids=["dy", "ds+dy"])
@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: "-".join(str(t).removeprefix("torch.") for t in d))
@pytest.mark.parametrize(("rows", "width"), list(itertools.product(ROWS, WIDTHS)))
def test_add_rms_norm_matches_float64(rows, width, dtypes, with_ds):
    x_dtype, r_dtype, out_dtype = dtypes
    x, r, w = _inputs((rows, width), x_dtype, r_dtype)
    s, y = add_rms_norm(x, r, w, out_dtype=out_dtype)
    y_dtype = out_dtype or x_dtype
    assert s.dtype == x_dtype and y.dtype == y_dtype and s.shape == y.shape == (rows, width)
    # The sum is one fp32 add rounded to x's dtype: bit for bit what PyTorch's add gives.
    assert torch.equal(s, (x.float() + r.float()).to(x_dtype))
    g = torch.Generator().manual_seed(1)
    dy = torch.randn(rows, width, generator=g).to(y_dtype)
    ds = torch.randn(rows, width, generator=g).to(x_dtype) if with_ds else None
    gx, gr, gw = torch.autograd.grad((s, y) if with_ds else y, (x, r, w), (ds, dy) if with_ds else dy)
    assert gx.dtype == x_dtype and gr.dtype == r_dtype and gw.dtype == w.dtype
    s_ref, y_ref, (gx_ref, gr_ref, gw_ref) = _reference(x, r, w, ds, dy)
    tol = max(TOL[x_dtype], TOL[y_dtype])
    assert rel_err(s, s_ref) < TOL[x_dtype]
    assert rel_err(y, rms_norm_ref(s.double(), w.double())) < TOL[y_dtype]  # the norm of the stored s
    assert rel_err(y, y_ref) < tol
    terms = _dx_terms(s, w, dy, ds)
    assert rel_err(gx, gx_ref, scale=terms) < tol
    assert rel_err(gr, gr_ref, scale=terms) < max(tol, TOL[r_dtype])
    assert rel_err(gw, gw_ref) < tol
    if x_dtype == r_dtype:  # one gradient for both
        assert gx.data_ptr() == gr.data_ptr()
    else:  # the kernel wrote both: the residual's is x's rounded to its dtype
        assert torch.equal(gr, gx.to(r_dtype))


@pytest.mark.parametrize("with_ds", [False, True], ids=["dy", "ds+dy"])
def test_add_rms_norm_without_weight(with_ds):
    x, r, _ = _inputs((7, 123), F32, F16, weight=False)
    s, y = add_rms_norm(x, r, out_dtype=F16)
    dy = torch.randn(7, 123).to(F16)
    ds = torch.randn(7, 123) if with_ds else None
    gx, gr = torch.autograd.grad((s, y) if with_ds else y, (x, r), (ds, dy) if with_ds else dy)
    s_ref, y_ref, (gx_ref, gr_ref) = _reference(x, r, None, ds, dy)
    assert rel_err(s, s_ref) < 1e-5 and rel_err(y, y_ref) < 2e-3
    assert rel_err(gx, gx_ref) < 2e-3 and rel_err(gr, gr_ref) < 2e-3 and gr.dtype == F16


def test_add_rms_norm_strided_inputs_and_gradients():
    """Row-strided x and residual (taken as they are), a transposed residual and a last-dimension
    stride of 2 (copied), three dimensions, and an expanded (all-zero-stride) upstream gradient."""
    g = torch.Generator().manual_seed(2)
    big_x = torch.randn(2, 3, 200, generator=g).requires_grad_()
    x = big_x[..., 7:130]  # row stride 200
    big_r = torch.randn(3, 2, 300, generator=g).half().requires_grad_()
    r = big_r[..., 1:124].transpose(0, 1)  # rows in another order
    w = torch.randn(123, generator=g).requires_grad_()
    s, y = add_rms_norm(x, r, w, out_dtype=F16)
    big_dy = torch.randn(2, 3, 400, generator=g).half()
    dy = big_dy[..., ::2][..., :123]  # last-dimension stride 2
    loss = (y.float() * dy.float()).sum() + s.sum()  # s's gradient: an expanded scalar
    loss.backward()
    xr, rr, wr = f64(big_x), f64(big_r), f64(w)
    s_ref = xr[..., 7:130] + rr[..., 1:124].transpose(0, 1)
    y_ref = rms_norm_ref(s_ref, wr)
    ((y_ref * dy.double()).sum() + s_ref.sum()).backward()
    assert s.shape == y.shape == (2, 3, 123)
    assert rel_err(s, s_ref) < 1e-5 and rel_err(y, y_ref) < 2e-3
    # Zero in the columns outside the views, on both sides.
    assert rel_err(big_x.grad, xr.grad) < 2e-3 and rel_err(big_r.grad, rr.grad) < 2e-3
    assert rel_err(w.grad, wr.grad) < 2e-3


def test_only_s_used_passes_its_gradient_through():
    x, r, w = _inputs((5, 40), F32, F16)
    s, _ = add_rms_norm(x, r, w)
    ds = torch.randn(5, 40)
    s.backward(ds)
    assert torch.equal(x.grad, ds) and torch.equal(r.grad, ds.half()) and w.grad is None


def test_only_the_inputs_that_need_a_gradient_get_one():
    x, r, w = _inputs((5, 40), F32, F16)
    x.requires_grad_(False)
    s, y = add_rms_norm(x, r, w)
    dy = torch.randn(5, 40)
    gr, gw = torch.autograd.grad(y, (r, w), dy)
    _, _, (_, gr_ref, gw_ref) = _reference(x, r, w, None, dy)
    assert gr.dtype == F16 and rel_err(gr, gr_ref) < 2e-3 and rel_err(gw, gw_ref) < 1e-5


def test_add_rms_norm_is_deterministic():
    x, r, w = _inputs((129, 123), F32, F16)
    dy = torch.randn(129, 123)
    first = torch.autograd.grad(add_rms_norm(x, r, w)[1], (x, r, w), dy)
    second = torch.autograd.grad(add_rms_norm(x, r, w)[1], (x, r, w), dy)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda x, w: add_rms_norm(x, torch.randn(4, 15), w),
            r"^residual: shape \(4, 15\) differs from x's \(4, 16\)",
        ),
        (lambda x, w: add_rms_norm(x, torch.randn(16), w), r"^residual: shape"),
        (lambda x, w: add_rms_norm(x, x.to(torch.int32), w), r"^residual: unsupported dtype torch.int32"),
        (lambda x, w: add_rms_norm(x, x.double(), w), r"^residual: unsupported dtype torch.float64"),
        (lambda x, w: add_rms_norm(x, [1.0] * 16, w), r"^residual: expected a torch.Tensor"),
        (lambda x, w: add_rms_norm(x, x.to("meta"), w), r"^residual: expected a tensor on cpu"),
        (lambda x, w: add_rms_norm(x.double(), x, w), r"^x: unsupported dtype"),
        (lambda x, w: add_rms_norm(x, x, torch.ones(15)), r"^weight: expected shape \(16,\)"),
        (lambda x, w: add_rms_norm(x, x, w, eps=0.0), r"^eps: must be a positive number"),
        (lambda x, w: add_rms_norm(x, x, w, out_dtype=torch.int8), r"^out_dtype: expected None or one of"),
        (lambda x, w: add_rms_norm(torch.randn(1, 65537), torch.randn(1, 65537)), r"^x: last dimension"),
    ],
)
def test_add_rms_norm_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.randn(4, 16), torch.ones(16))


# --------------------------------------------------------------------- the weight gradient's partial sums
@pytest.mark.parametrize(
    ("n_parts", "n_cols", "out_dtype"),
    [(1, 1, F32), (37, 1, F16), (3, 65536, F32), (1056, 1280, F32), (1056, 1280, F16), (517, 123, F32)],
)
def test_sum_partials_matches_float64(n_parts, n_cols, out_dtype):
    from tritonlab.ops.rms_norm import _sum_partials_blocks, _sum_partials_kernel

    partial = torch.randn(n_parts, n_cols)
    out = torch.empty(n_cols, dtype=out_dtype)
    block_p, block_c = _sum_partials_blocks(n_parts, n_cols, partial.device)
    _sum_partials_kernel[(triton.cdiv(n_cols, block_c),)](
        partial, out, n_parts, n_cols, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=4
    )
    assert rel_err(out, partial.double().sum(0)) < TOL[out_dtype]


def test_sum_partials_blocks_on_the_h100(monkeypatch):
    """132 SMs: at the LM's width 1280 and 1056 partial rows, 160 programs of 8 columns summing 512
    rows a step (the old grid: 20 programs of 64 columns, 32 rows a step); a 65 536-wide row's 3
    partials in one step of 4 x 256; one column, all rows at once up to the tile."""
    from tritonlab.ops.rms_norm import _sum_partials_blocks

    module = sys.modules["tritonlab.ops.rms_norm"]  # tritonlab.ops.rms_norm the attribute is the function
    monkeypatch.setattr(module, "sm_count", lambda device=None: 132)
    assert _sum_partials_blocks(1056, 1280, None) == (512, 8)
    assert _sum_partials_blocks(528, 1024, None) == (512, 8)
    assert _sum_partials_blocks(3, 65536, None) == (4, 256)
    assert _sum_partials_blocks(1056, 8192, None) == (128, 32)
    assert _sum_partials_blocks(1056, 1, None) == (2048, 1)
    assert _sum_partials_blocks(5000, 1, None) == (4096, 1)


_BUILD = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tritonlab.ops.rms_norm import _rms_norm_bwd_kernel, _rms_norm_fwd_kernel, _sum_partials_kernel
from tritonlab.tuning import ptxas_report

def build(kernel, types, consts, warps):
    sig = {n: types.get(n, "i32") for n in kernel.arg_names}
    sig.update({c: "constexpr" for c in consts})
    out = triton.compile(ASTSource(kernel, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": warps})
    return ptxas_report(out.asm["ptx"], "sm_90a")

results = {}
# The LM `large` under autocast: width 1280 (a padded row of 2048, one a program, 4 warps), a float32
# stream plus a bf16 branch output, y in bf16; the backward with ds and both gradients.
results["fwd"] = build(_rms_norm_fwd_kernel,
    {"X": "*fp32", "W": "*fp32", "Y": "*bf16", "RSTD": "*fp32", "R": "*bf16", "S": "*fp32", "eps": "fp32",
     "offset": "fp32"},
    {"BLOCK_M": 1, "BLOCK_N": 2048, "HAS_WEIGHT": True, "HAS_OFFSET": False, "HAS_RESIDUAL": True}, 4)
results["bwd"] = build(_rms_norm_bwd_kernel,
    {"DY": "*bf16", "X": "*fp32", "W": "*fp32", "RSTD": "*fp32", "DX": "*fp32", "DW_PARTIAL": "*fp32",
     "DS": "*fp32", "DR": "*bf16", "offset": "fp32"},
    {"BLOCK_M": 1, "BLOCK_N": 2048, "NUM_STAGES": 3, "HAS_WEIGHT": True, "HAS_OFFSET": False, "HAS_DS": True,
     "HAS_DR": True}, 4)
results["sum"] = build(_sum_partials_kernel, {"PARTIAL": "*fp32", "OUT": "*fp32"},
                       {"BLOCK_P": 512, "BLOCK_C": 8}, 4)
print(json.dumps(results))
"""


@pytest.mark.skipif(triton_tools_missing("ptxas"), reason="needs Triton's ptxas")
def test_the_fused_kernels_build_for_sm90_without_spills():
    """Compiled for the H100 on the CPU (nothing runs): the fused forward and backward at the LM's
    width, and the partial sums' 512 x 8 tile, spill nothing."""
    results = json.loads(run_without_interpreter(_BUILD).stdout.strip().splitlines()[-1])
    for name, report in results.items():
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0, (name, report)
