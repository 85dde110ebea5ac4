"""The Gluon forward for Hopper (tritonlab/attention/forward_hopper.py): built for sm_90a on the CPU
(warp-specialised, within Hopper's shared memory, no spills), refused with a clear error where it
cannot run, and on an H100 against float64 at odd shapes, strided and contiguous, D 64 and 128."""

import json

import pytest
import torch

from tritonlab._runtime import kernel_device_type
from tritonlab.attention import attention_forward, forward_hopper, reference_attention
from tritonlab.attention.forward import GLUON_FROM_LK
from tritonlab.testing import (
    model_qkv,
    poisoned_empty,
    rel_err,
    run_without_interpreter,
    triton_tools_missing,
)
from tritonlab.tuning import HOPPER_SHARED_MEMORY, ConfigRecord

DEVICE = kernel_device_type()
HOPPER = DEVICE == "cuda" and torch.cuda.get_device_capability()[0] == 9

_BUILD = r"""
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from tritonlab.attention.forward_hopper import CONFIGS, ROWS_PER_WARPGROUP, _attn_fwd_hopper_kernel
from tritonlab.testing import hopper_descriptor_type as desc
from tritonlab.tuning import ptxas_report, sass

results = {}
for (d, (block_n, stages)), causal in [(c, causal) for c in CONFIGS.items() for causal in (False, True)]:
    sig = {"q_desc": desc(ROWS_PER_WARPGROUP, d), "k_desc": desc(block_n, d), "v_desc": desc(block_n, d),
           "O": "*bf16", "LSE": "*fp32", "qk_scale": "fp32", "stride_ob": "i32", "stride_oh": "i32",
           "stride_ol": "i32", "H": "i32", "Lq": "i32", "Lk": "i32",
           "HEAD_DIM": "constexpr", "BLOCK_N": "constexpr", "STAGES": "constexpr", "CAUSAL": "constexpr"}
    consts = {"HEAD_DIM": d, "BLOCK_N": block_n, "STAGES": stages, "CAUSAL": causal}
    out = triton.compile(GluonASTSource(_attn_fwd_hopper_kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4})
    code = sass(out.asm["ptx"], "sm_90a")
    results[f"{d}-{causal}"] = {"shared": out.metadata.shared, "warps": out.metadata.num_warps,
                  **ptxas_report(out.asm["ptx"], "sm_90a"), "hgmma": len(re.findall(r"HGMMA", code))}
print(json.dumps(results))
"""


@pytest.mark.skipif(triton_tools_missing("ptxas", "cuobjdump"), reason="needs Triton's ptxas and cuobjdump")
def test_the_sm90a_build_is_warp_specialised_fits_and_does_not_spill():
    results = json.loads(run_without_interpreter(_BUILD).stdout.strip().splitlines()[-1])
    assert set(results) == {f"{d}-{causal}" for d in forward_hopper.CONFIGS for causal in (False, True)}
    for d, r in results.items():
        # Three softmax warpgroups and a load warp, padded to whole warpgroups: 16 warps.
        assert r["warps"] == 16, (d, r)
        assert r["shared"] <= HOPPER_SHARED_MEMORY, (d, r)
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (d, r)
        assert r["hgmma"] > 0, (d, r)


def test_asking_for_gluon_where_it_cannot_run_is_a_clear_value_error():
    q, k, v = model_qkv(1, 2, 9, 5, 16, torch.float16 if DEVICE == "cpu" else torch.bfloat16)
    with pytest.raises(ValueError, match="impl: 'gluon' needs"):
        attention_forward(q, k, v, impl="gluon")


def test_auto_keeps_the_triton_kernel_where_gluon_cannot_run():
    record = ConfigRecord()
    attention_forward(*model_qkv(1, 1, 9, 5, 16, torch.float32), record=record)
    assert not record.picked["forward"].startswith("gluon")


# --- GPU (Hopper) ------------------------------------------------------------------------------

hopper_only = pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize("layout", ["model", "contiguous"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", forward_hopper.GLUON_HEAD_DIMS)
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk"),
    [(1, 1, 1, 1), (2, 3, 17, 100), (1, 2, 257, 1000), (2, 1, 1000, 17), (1, 8, 193, 129), (1, 2, 300, 1025)],
)
def test_gluon_forward_matches_float64(B, H, Lq, Lk, D, dtype, layout):
    if layout == "model":
        q, k, v = model_qkv(B, H, Lq, Lk, D, dtype)
    else:
        q, k, v = (torch.randn(B, H, n, D, device="cuda", dtype=dtype) for n in (Lq, Lk, Lk))
    with poisoned_empty():
        o, lse = attention_forward(q, k, v, impl="gluon")
    o_ref, lse_ref = reference_attention(q, k, v)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    # P is rounded to the input dtype for the P V product, as in every flash attention.
    assert rel_err(o, o_ref) < (1e-2 if dtype == torch.bfloat16 else 2e-3)
    assert (lse.double() - lse_ref).abs().max().item() < 1e-3


@pytest.mark.gpu
@hopper_only
def test_gluon_forward_survives_large_and_equal_scores():
    q, k, v = model_qkv(1, 2, 300, 1100, 64, torch.bfloat16, scale_inputs=100.0)
    o, lse = attention_forward(q, k, v, impl="gluon")
    o_ref, lse_ref = reference_attention(q, k, v)
    assert rel_err(o, o_ref) < 2e-2 and torch.isfinite(lse).all()
    # All scores equal: o is the mean of v.
    q = torch.zeros(1, 1, 70, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, 1100, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 1, 1100, 64, device="cuda", dtype=torch.bfloat16)
    o, _ = attention_forward(q, k, v, impl="gluon")
    assert rel_err(o[0, 0], v[0, 0].double().mean(0).expand(70, 64)) < 1e-2


@pytest.mark.gpu
@hopper_only
def test_auto_takes_gluon_from_the_threshold_and_records_it():
    for lk, gluon in ((GLUON_FROM_LK - 1, False), (GLUON_FROM_LK, True)):
        record = ConfigRecord()
        attention_forward(*model_qkv(1, 8, 500, lk, 64, torch.bfloat16), record=record)
        assert record.picked["forward"].startswith("gluon:") == gluon, (lk, record.picked)
