"""Phase 05's cells: the FP8 attention -- forward, and forward + bf16 backward -- against our bf16
attention (the same modes), SDPA cuDNN and SDPA flash, at the TransformerNP's shapes and the Lk sweep.

Every cell records its errors against the same reference, SDPA in the run's dtype (cuDNN on a GPU,
the math backend on the CPU): max abs (``err_*``), max abs over the reference's largest value
(``relerr_*``) and relative Frobenius (``frob_*``), for O and, with the backward, dQ, dK, dV. The
FP8 rows beside our bf16 rows give the accuracy FP8 costs, per shape. Correctness is checked before
timing: the bf16 variants with phase 02/03's bounds, the FP8 variant with the bounds
``tritonlab.attention.fp8`` states (relative Frobenius error of O and of the gradients).

On a GPU the FP8 variant asks for FP8 explicitly (``force_fp8=True``): a GPU without it gives error
rows, never bf16 timings under the FP8 name. On the CPU the public functions would run bf16, so the
variant calls the FP8 kernels themselves, which Triton's interpreter runs (exact e4m3 rounding).
"""

import functools
from functools import partial

from torch.nn.attention import SDPBackend

from common import ON_GPU
from common.attention_bench import (
    CONFIG_COLUMNS,
    GRAD_TOLERANCE,
    TOLERANCE,
    Case,
    make_inputs,
    max_errors,
    run_case,
    sdpa,
    sdpa_variants,
)
from common.memory import measure_peak_memory
from common.runner import Cell, check_close, timed
from tritonlab.attention import (
    attention,
    attention_forward,
    fp8_attention,
    fp8_attention_forward,
    fused_attention,
)
from tritonlab.attention import fp8 as fp8_kernels
from tritonlab.testing import DTYPES, rel_err
from tritonlab.tuning import ConfigRecord

from .report import FP8, FP8_TRITON, OURS_BF16, OURS_BF16_FUSED

MODES = ("fwd", "fwd+bwd")
GRADS = ("dq", "dk", "dv")


def _interpreted_fp8(q, k, v, *, backward: bool, record=None):
    """The FP8 kernels in Triton's interpreter (the CPU), where the public functions run bf16."""
    scale = q.shape[-1] ** -0.5
    if backward:
        return fp8_kernels._FP8AttentionFunction.apply(q, k, v, scale, record)
    return fp8_kernels._fp8_forward(q, k, v, scale, record)


def variants(mode: str) -> dict:
    backward = mode == "fwd+bwd"
    if ON_GPU:
        fp8 = partial(fp8_attention if backward else fp8_attention_forward, force_fp8=True)
        ours = {FP8: fp8, FP8_TRITON: partial(fp8, impl="triton")}
    else:  # one FP8 kernel runs in the interpreter
        ours = {FP8: partial(_interpreted_fp8, backward=backward)}
    ours[OURS_BF16[mode]] = attention if backward else attention_forward
    if backward:
        ours[OURS_BF16_FUSED] = fused_attention
    return {**ours, **sdpa_variants()}


def cells(cases: list[Case], dtype: str, modes) -> tuple:
    chosen = {mode: variants(mode) for mode in modes}
    total = sum(len(v) for v in chosen.values()) * len(cases)
    return _cells(cases, dtype, chosen), total


def _cells(cases, dtype: str, chosen: dict):
    torch_dtype = DTYPES[dtype]
    reference = sdpa(SDPBackend.CUDNN_ATTENTION if ON_GPU else SDPBackend.MATH)
    for case in cases:
        for mode, fns in chosen.items():
            backward = mode == "fwd+bwd"

            @functools.cache
            def prepared(case=case, backward=backward):
                inputs = make_inputs(case, torch_dtype, backward)
                return inputs, [t.detach() for t in run_case(reference, *inputs, backward)]

            for variant, fn in fns.items():
                run = partial(_measure, case, variant, fn, prepared, backward)
                yield Cell(variant, case.label, dtype, run, {"mode": mode, **case.columns()})
            prepared.cache_clear()  # the case's tensors go before the next ones are made


def errors(ours, ref) -> dict:
    """``max_errors``' columns and the relative Frobenius error of each output."""
    row = max_errors(ours, ref)
    for name, a, b in zip(("o", *GRADS), ours, ref, strict=False):
        row[f"frob_{name}"] = rel_err(a, b)
    return row


def check(variant: str, row: dict) -> None:
    """The FP8 variant against fp8.py's bounds; the bf16 ones against phase 02/03's."""
    if variant in (FP8, FP8_TRITON):
        check_close("O against SDPA (relative Frobenius)", row["frob_o"], fp8_kernels.ERROR_BOUND)
        for g in GRADS:
            if f"frob_{g}" in row:
                check_close(
                    f"{g} against SDPA (relative Frobenius)", row[f"frob_{g}"], fp8_kernels.GRAD_BOUND
                )
        return
    check_close("output against SDPA (max abs)", row["err_o"], TOLERANCE)
    for g in GRADS:
        if f"relerr_{g}" in row:
            check_close(f"{g} against SDPA (relative to its largest)", row[f"relerr_{g}"], GRAD_TOLERANCE)


def _measure(case: Case, variant: str, fn, prepared, backward: bool) -> dict:
    inputs, ref = prepared()
    record = ConfigRecord() if variant.startswith("triton") else None
    attend = partial(fn, record=record) if record is not None else fn

    def call():
        return run_case(attend, *inputs, backward)

    call()  # compiles and autotunes (the FP8 quantisation launch included), so the peak is one call's
    with measure_peak_memory() as mem:
        row = errors([t.detach() for t in call()], ref)
    check(variant, row)
    large = case.lq * case.lk * case.batch * case.heads > 2e10
    budget = {"warmup_ms": 25.0, "rep_ms": 150.0}
    if large or not ON_GPU:  # one call takes ~0.1 s at large; in the interpreter a call only has to run
        budget = {"warmup_ms": 1.0, "rep_ms": 1.0, "min_reps": 1}
    flops = (3.5 if backward else 1.0) * case.forward_flops()  # backward = 2.5 × the forward
    row.update(timed(call, flops=flops, **budget))
    row.update(peak_mem_gb=mem.peak_gb, call_mem_gb=(mem.peak_bytes - mem.start_bytes) / 1e9)
    if record is not None:
        row.update({CONFIG_COLUMNS.get(k, k): v for k, v in record.picked.items()})
    return row
