"""The Gluon forward for Hopper (tritonlab/attention/forward_hopper.py): built for sm_90a on the CPU
(warp-specialised, within Hopper's shared memory, no spills), refused with a clear error where it
cannot run, and on an H100 against float64 at odd shapes, strided and contiguous, D 64 and 128."""

import json
import math

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
from tritonlab.tuning import ptxas_report, sass, sass_fingerprint

results = {}
variants = [(c, causal, False) for c in CONFIGS.items() for causal in (False, True)]
variants += [(c, False, True) for c in CONFIGS.items()]  # the tail's key chunks: not causal
for (d, (block_n, stages)), causal, split in variants:
    sig = {"q_desc": desc(ROWS_PER_WARPGROUP, d), "k_desc": desc(block_n, d), "v_desc": desc(block_n, d),
           "O": "*bf16", "LSE": "*fp32", "PARTS": "*fp32" if split else "constexpr", "qk_scale": "fp32",
           "stride_ob": "i32", "stride_oh": "i32", "stride_ol": "i32", "H": "i32", "Lq": "i32", "Lk": "i32",
           "first_block": "i32", "split": "i32", "HEAD_DIM": "constexpr", "BLOCK_N": "constexpr",
           "STAGES": "constexpr", "CAUSAL": "constexpr", "SPLIT_KV": "constexpr"}
    consts = {"HEAD_DIM": d, "BLOCK_N": block_n, "STAGES": stages, "CAUSAL": causal, "SPLIT_KV": split}
    if not split:
        consts["PARTS"] = None
    out = triton.compile(GluonASTSource(_attn_fwd_hopper_kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4})
    code = sass(out.asm["ptx"], "sm_90a")
    results[f"{d}-{causal}" + ("-split" if split else "")] = {"shared": out.metadata.shared, "warps": out.metadata.num_warps,
                  **ptxas_report(out.asm["ptx"], "sm_90a"), "hgmma": len(re.findall(r"HGMMA", code)),
                  **sass_fingerprint(out.asm["ptx"], "sm_90a")}
print(json.dumps(results))
"""


# The fingerprints (tuning.sass_fingerprint) of the builds the reports' rows time: not causal, whole
# and with the split tail, phase 02's mid rows and phase 12's (f12023d); causal, flash2's (1fb999c). A source change that leaves the output alone
# can still move ptxas' schedule (the FP8 forward once lost 1.19x so, phase 05's README): a new
# fingerprint replaces one only with a timing of its build against the old one committed beside.
TIMED_BUILDS = {
    "64-False": "bcdb1db96205a9e1",
    "64-False-split": "d5bf7a13b824ddbb",
    "64-True": "4b872b1fe52575eb",
}


@pytest.mark.skipif(triton_tools_missing("ptxas", "cuobjdump"), reason="needs Triton's ptxas and cuobjdump")
def test_the_sm90a_build_is_warp_specialised_fits_and_does_not_spill():
    results = json.loads(run_without_interpreter(_BUILD).stdout.strip().splitlines()[-1])
    assert set(results) == {f"{d}-{causal}" for d in forward_hopper.CONFIGS for causal in (False, True)} | {
        f"{d}-False-split" for d in forward_hopper.CONFIGS
    }
    for d, r in results.items():
        # Three softmax warpgroups and a load warp, padded to whole warpgroups: 16 warps.
        assert r["warps"] == 16, (d, r)
        assert r["shared"] <= HOPPER_SHARED_MEMORY, (d, r)
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (d, r)
        assert r["hgmma"] > 0, (d, r)
    for d, sha in TIMED_BUILDS.items():
        assert results[d]["sass_sha"] == sha, f"{d}: the sm_90a build changed; time it (see TIMED_BUILDS)"


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


def test_combine_parts_merges_key_chunks_into_the_tail_rows():
    """combine_parts: each tail block's key-chunk shares (o over the chunk, its base-2 logsumexp)
    merged into the attention over all keys, in o's strided rows; rows past Lq and every other block
    left as they were (interpreter or GPU)."""
    B, H, Lq, Lk, D, split = 1, 2, 200, 50, 16, 3
    n_m, BLOCK_M = 2, forward_hopper.BLOCK_M  # 192-row query blocks: 2 a head, the second ragged
    first_block, n_tail = 1, 3  # head 0's second block, head 1's two
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=g, device=DEVICE, dtype=torch.float64) for n in (Lq, Lk, Lk))
    bounds = [0, 17, 33, Lk]
    parts = torch.randn(n_tail * split * BLOCK_M, D + 1, generator=g, device=DEVICE)
    for t in range(n_tail):
        bh, qb = divmod(first_block + t, n_m)
        rows = slice(qb * BLOCK_M, min((qb + 1) * BLOCK_M, Lq))
        for i in range(split):
            keys = slice(bounds[i], bounds[i + 1])
            o_i, lse_i = reference_attention(q[:, :, rows], k[:, :, keys], v[:, :, keys])
            at = (t * split + i) * BLOCK_M
            n = rows.stop - rows.start
            parts[at : at + n, :D] = o_i[0, bh].float()
            parts[at : at + n, D] = (lse_i[0, bh] / math.log(2)).float()
    storage = torch.full((B, Lq, H, D + 4), float("nan"), device=DEVICE, dtype=torch.float16)
    o = storage[..., :D].transpose(1, 2)
    lse = torch.full((B, H, Lq), float("nan"), device=DEVICE)
    forward_hopper.combine_parts(parts, o, lse, first_block, split)
    o_ref, lse_ref = reference_attention(q, k, v)
    assert torch.isnan(o[0, 0, :BLOCK_M]).all() and torch.isnan(lse[0, 0, :BLOCK_M]).all()
    assert rel_err(o[0, 0, BLOCK_M:], o_ref[0, 0, BLOCK_M:]) < 2e-3 and rel_err(o[0, 1], o_ref[0, 1]) < 2e-3
    assert (lse[0, 0, BLOCK_M:].double() - lse_ref[0, 0, BLOCK_M:]).abs().max() < 1e-4
    assert (lse[0, 1].double() - lse_ref[0, 1]).abs().max() < 1e-4
    assert torch.isnan(storage[..., D:]).all()


def test_a_tail_is_refused_for_a_causal_forward():
    t = torch.zeros(1, 1, 64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="tail: only a non-causal forward"):
        forward_hopper.forward(t, t, t, t, t[..., 0].float(), 0.18, causal=True, tail=(1, 2))


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk", "D", "tail"),
    [
        (1, 2, 300, 1025, 64, (3, 4)),  # three of four query blocks, 9 key tiles in 4 chunks
        (2, 3, 193, 2049, 64, None),  # tail_split's own choice: every block, 8 chunks of 17 tiles
        (1, 1, 1, 1000, 128, (1, 8)),  # one row; D = 128's 64-key tiles, the last chunk ragged
        (1, 2, 257, 129, 64, (4, 2)),  # a one-tile chunk that is the ragged last tile
    ],
)
def test_split_tail_forward_matches_float64_and_the_whole_forward(B, H, Lq, Lk, D, tail):
    q, k, v = model_qkv(B, H, Lq, Lk, D, torch.bfloat16)
    outs = []
    for split in (tail, (0, 1)):
        with poisoned_empty():
            o = torch.empty_like(q)
            lse = torch.empty(B, H, Lq, device="cuda")
        forward_hopper.forward(q, k, v, o, lse, D**-0.5 * 1.4426950408889634, tail=split)
        outs.append((o, lse))
    (o, lse), (o_whole, lse_whole) = outs
    o_ref, lse_ref = reference_attention(q, k, v)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert rel_err(o, o_ref) < 1e-2 and rel_err(o, o_whole) < 1e-2
    assert (lse.double() - lse_ref).abs().max().item() < 1e-3
