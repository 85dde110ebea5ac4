"""The Gluon dK/dV kernel for Hopper (tritonlab/attention/backward_hopper.py): built for sm_90a on the
CPU, and on an H100 the two-pass backward that uses it against float64 at odd shapes, strided and
contiguous."""

import json

import pytest
import torch

from tritonlab._runtime import kernel_device_type
from tritonlab.attention import attention, fused_attention
from tritonlab.attention._common import TAIL_MAX_SPLIT, TAIL_MIN_TILES, backward_delta, tail_split
from tritonlab.attention.backward_hopper import (
    CONFIGS,
    DEFER_DQ,
    FUSED_CONFIGS,
    _deferred,
    config_string,
    dkdv,
    launch_config,
    round_tail_sums,
)
from tritonlab.attention.flash2 import flash_forward
from tritonlab.attention.forward import GLUON_FROM_LK
from tritonlab.attention.reference import reference_attention
from tritonlab.testing import model_qkv, rel_err, run_without_interpreter, triton_tools_missing
from tritonlab.tuning import HOPPER_SHARED_MEMORY, ConfigRecord

DEVICE = kernel_device_type()
HOPPER = DEVICE == "cuda" and torch.cuda.get_device_capability()[0] == 9

_BUILD = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
import torch
from tritonlab.attention.backward_hopper import CONFIGS, FUSED_CONFIGS, ROWS, _dkdv_kernel
from tritonlab._gluon import shared_layout
from tritonlab.testing import hopper_descriptor_type as desc
from tritonlab.tuning import ptxas_report, sass_fingerprint

results = {}
variants = [(d, c, f, df, False) for d in CONFIGS for c in (False, True) for f in (False, True)
            for df in ((False, True) if f else (False,)) if d in FUSED_CONFIGS or not f]
variants += [(64, False, True, False, True)]  # the split tail: non-causal, fused, immediate dQ
for d, causal, fused, defer, split in variants:
    block_m, stages, regs, *dq_stages = FUSED_CONFIGS[d] if fused else CONFIGS[d]
    sig = {"q_desc": desc(block_m, d), "k_desc": desc(ROWS, d), "v_desc": desc(ROWS, d), "do_desc": desc(block_m, d),
           "LSE": "*fp32", "DELTA": "*fp32", "GRADS": "*bf16",
           "dq_desc": desc(block_m, d, "fp32") if fused else "constexpr", "TAIL": "*fp32" if split else "constexpr",
           "scale": "fp32", "qk_scale": "fp32",
           "stride_gs": "i64", "stride_gb": "i32", "stride_gh": "i32", "stride_gl": "i32", "H": "i32", "Lq": "i32",
           "Lk": "i32", "first_block": "i32", "split": "i32", "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr", "STAGES": "constexpr",
           "CAUSAL": "constexpr", "REGS": "constexpr", "FUSED_DQ": "constexpr", "DS_LAYOUT": "constexpr",
           "DQ_STAGES": "constexpr", "DEFER": "constexpr", "SPLIT_TAIL": "constexpr"}
    consts = {"HEAD_DIM": d, "BLOCK_M": block_m, "STAGES": stages, "CAUSAL": causal, "REGS": regs,
              "FUSED_DQ": fused, "DS_LAYOUT": shared_layout((ROWS, block_m), torch.bfloat16) if fused else None,
              "DQ_STAGES": dq_stages[0] if fused else 1, "DEFER": defer, "SPLIT_TAIL": split}
    if not fused:
        consts["dq_desc"] = None
    if not split:
        consts["TAIL"] = None
    out = triton.compile(GluonASTSource(_dkdv_kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4})
    results[f"{d}-{causal}" + ("-fused" if fused else "") + ("-defer" if defer else "") + ("-split" if split else "")] = {"shared": out.metadata.shared, "warps": out.metadata.num_warps,
                  **ptxas_report(out.asm["ptx"], "sm_90a"), **sass_fingerprint(out.asm["ptx"], "sm_90a")}
print(json.dumps(results))
"""


# The fingerprints (tuning.sass_fingerprint) of the builds the reports' rows time, the same at
# 1fb999c, d44f76e and f12023d: at D = 64, not causal (phases 04 and 12), the two-pass dK/dV kernel
# and the fused one (dQ deferred; immediate in the split tail's launch); causal, flash2's fused one. A source change that leaves the
# gradients alone can still move ptxas' schedule (the FP8 forward once lost 1.19x so, phase 05's
# README): a new fingerprint replaces one only with a timing of its build against the old one.
TIMED_BUILDS = {
    "64-False": "7d1d138f4aa2e769",
    "64-False-fused-defer": "bab3c471e04bd83e",
    "64-False-fused-split": "75ec8a4f65f7f72b",
    "64-True-fused-defer": "6cb0871cbb2f37d9",
}


@pytest.mark.skipif(triton_tools_missing("ptxas", "cuobjdump"), reason="needs Triton's ptxas and cuobjdump")
def test_the_sm90a_build_fits_hopper():
    results = json.loads(run_without_interpreter(_BUILD).stdout.strip().splitlines()[-1])
    # The fused kernel has a config at D = 64 only (at 128 callers take the two-pass backward).
    assert set(results) == {f"{d}-{c}" for d in (64, 128) for c in (False, True)} | {
        f"64-{c}-fused{df}" for c in (False, True) for df in ("", "-defer")
    } | {"64-False-fused-split"}
    for key, r in results.items():
        # Two MMA warpgroups and a load warp, padded to whole warpgroups: 12 warps.
        assert r["warps"] == 12, (key, r)
        assert r["shared"] <= HOPPER_SHARED_MEMORY, (key, r)
        # Measured (sm_90a, 240 registers for the second MMA warpgroup): none at D = 64, fused or not,
        # but 172 bytes a thread with the deferred dQ (344 causal); at D = 128 (two 64 x 128 fp32
        # accumulators) 40 bytes, 100 causal -- kept: the fastest configs measured there.
        most = {"128-False": 48, "128-True": 112, "64-False-fused-defer": 180, "64-True-fused-defer": 360}
        assert r["spill_stores"] <= most.get(key, 0), (key, r)
    for key, sha in TIMED_BUILDS.items():
        assert results[key]["sass_sha"] == sha, f"{key}: the sm_90a build changed; time it (see TIMED_BUILDS)"


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("backward", ["two-pass", "fused"])
@pytest.mark.parametrize("layout", ["model", "contiguous"])
@pytest.mark.parametrize(("dtype", "D"), [(torch.bfloat16, 64), (torch.float16, 64), (torch.bfloat16, 128)])
@pytest.mark.parametrize(
    ("B", "H", "Lq", "Lk"),
    [(1, 2, 257, GLUON_FROM_LK), (2, 1, 1000, 1017), (1, 8, 193, 1100), (1, 1, 1, 1000), (2, 3, 130, 2049)],
)
def test_gluon_dkdv_gradients_match_float64(B, H, Lq, Lk, dtype, D, layout, backward):
    """The two-pass backward's Gluon dK/dV, and the fused backward's (the same kernel adding dQ with
    TMA reductions; at D = 128 the two-pass one), against float64."""
    if layout == "model":
        q, k, v = model_qkv(B, H, Lq, Lk, D, dtype)
    else:
        q, k, v = (torch.randn(B, H, n, D, device="cuda", dtype=dtype) for n in (Lq, Lk, Lk))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    do = torch.randn(B, H, Lq, D, device="cuda", dtype=dtype)
    record = ConfigRecord()
    fn = attention if backward == "two-pass" else fused_attention
    fn(q, k, v, record=record).backward(do)
    if backward == "two-pass" or D not in FUSED_CONFIGS:  # (fused_attention's backward at D = 128)
        assert record.picked["dkdv"].startswith("gluon:") and "fused" not in record.picked, record.picked
    else:
        assert record.picked["fused"].startswith("gluon:") and "dq=tma-reduce" in record.picked["fused"]
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o_ref = torch.softmax(ref[0] @ ref[1].transpose(-1, -2) * D**-0.5, -1) @ ref[2]
    o_ref.backward(do.double())
    bound = 1e-2 if dtype == torch.bfloat16 else 2e-3
    for name, got, want in zip("qkv", (q, k, v), ref, strict=True):
        assert torch.isfinite(got.grad).all(), name
        assert rel_err(got.grad, want.grad) < bound, name


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("BH", "Lq", "Lk"), [(2, 1, 1000), (2, 257, 1017), (3, 193, 130), (4, 2049, 999)])
def test_deferred_dq_matches_float64(BH, Lq, Lk, causal):
    """dkdv(defer=True): the fused backward with its dQ products a tile late -- query tile counts
    odd and even, one tile, causal or not -- against float64."""
    D = 64
    q, k, v, do = (torch.randn(BH, n, D, device="cuda", dtype=torch.bfloat16) for n in (Lq, Lk, Lk, Lq))
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    reference_attention(*ref, is_causal=causal)[0].backward(do.double())  # top-left aligned, as flash2's
    o, lse = flash_forward(q, k, v, causal)
    delta = backward_delta(o, do)
    grads = torch.empty((2, BH, 1, Lk, D), dtype=torch.bfloat16, device="cuda")
    dq = torch.zeros((BH, 1, Lq, D), dtype=torch.float32, device="cuda")
    heads = (t.unsqueeze(1) for t in (q, k, v, lse, do, delta))
    dkdv(*heads, grads, D**-0.5, causal=causal, dq=dq, defer=True)
    for name, got, want in zip("qkv", (dq[:, 0], grads[0, :, 0], grads[1, :, 0]), ref, strict=True):
        assert torch.isfinite(got).all(), name
        assert rel_err(got, want.grad) < 1e-2, name


def test_the_fused_launch_defers_by_default_where_it_builds():
    """DEFER_DQ holds at 2 ring stages (FUSED_CONFIGS'), and a 3-stage override falls back to the
    immediate dQ rather than raising; only an explicit defer=True there is refused."""
    assert _deferred(None, 2) is DEFER_DQ
    assert _deferred(None, 3) is False
    assert _deferred(False, 2) is False
    assert "deferred" in config_string(64, fused=True)
    assert all(stages == 2 for _, stages, *_ in FUSED_CONFIGS.values())


def test_defer_refuses_three_ring_stages():
    with pytest.raises(ValueError, match="defer=True builds with 2 ring stages"):
        t = torch.zeros(1, 1, 64, 64, dtype=torch.bfloat16)
        dkdv(t, t, t, t[..., 0].float(), t, t[..., 0].float(), torch.empty(2, 1, 1, 64, 64), 0.125,
             dq=t.float(), config=(64, 3, 240), defer=True)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
def test_deterministic_fused_backward_repeats_bit_for_bit():
    """deterministic=True keeps the one-launch kernel without atomics on Hopper: the same gradients
    on every run."""
    q, k, v = model_qkv(2, 4, 1000, 2049, 64, torch.bfloat16)
    do = torch.randn(2, 4, 1000, 64, device="cuda", dtype=torch.bfloat16)
    grads = []
    for _ in range(2):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        record = ConfigRecord()
        fused_attention(*leaves, deterministic=True, record=record).backward(do)
        assert not record.picked["fused"].startswith("gluon:"), record.picked
        grads.append([t.grad for t in leaves])
    for first, second in zip(*grads, strict=True):
        assert torch.equal(first, second)


def test_the_launch_takes_the_fused_configs_staging_tiles():
    """The fused launch's dQ staging tiles come from FUSED_CONFIGS unless overridden (a default of 1
    in dkdv's signature once silently won over the table)."""
    for d, (block_m, stages, regs, dq_stages) in FUSED_CONFIGS.items():
        assert launch_config(d, fused=True) == (block_m, stages, regs, dq_stages)
        assert launch_config(d, fused=True, dq_stages=1)[3] == 1
        assert launch_config(d, fused=True, config=(32, 3, 168)) == (32, 3, 168, dq_stages)
        assert launch_config(d, fused=False) == (*CONFIGS[d], 1)


def test_tail_split_spreads_a_thin_last_wave():
    """The last wave's key blocks are split only where they fill at most half the SMs and have
    TAIL_MIN_TILES query tiles, into as many chunks as the SMs allow, at most TAIL_MAX_SPLIT."""
    assert tail_split(2528, 132, 172) == (20, 6)  # mid: 79 key blocks x 32 heads, 172 query tiles
    assert tail_split(12504, 132, 3204) == (0, 1)  # large: the last wave is 96 of 132 SMs
    assert tail_split(2640, 132, 172) == (0, 1)  # whole waves
    assert tail_split(2528, 132, TAIL_MIN_TILES - 1) == (0, 1)
    assert tail_split(3, 132, 64) == (3, TAIL_MAX_SPLIT)  # a grid below one wave
    assert tail_split(133, 132, 64) == (1, TAIL_MAX_SPLIT)
    assert tail_split(66 + 132, 132, 64) == (66, 2)
    assert tail_split(67 + 132, 132, 64) == (0, 1)


def test_round_tail_sums_writes_only_the_tail_rows():
    """The tail blocks' float32 sums land, rounded, in their (head, key) rows of strided grads -- a
    ragged last block masked at Lk -- and nothing else changes (interpreter or GPU)."""
    B, H, Lk, D, block_n = 2, 3, 300, 64, 128
    n_k = -(-Lk // block_n)  # 3 key blocks a head, the last 44 keys long
    whole, n_tail = 2, 4  # blocks 2..5: head 0's last, head 1's three
    storage = torch.full((2, B, Lk, H, D + 8), 7.0, dtype=torch.bfloat16, device=DEVICE)
    grads = storage[..., :D].permute(0, 1, 3, 2, 4)  # (2, B, H, Lk, D), the model's layout
    sums = torch.randn(n_tail, 2, block_n, D, device=DEVICE)
    before = storage.clone()
    round_tail_sums(sums, grads, whole, n_k)
    want = before[..., :D].permute(0, 1, 3, 2, 4).clone()
    for t in range(n_tail):
        bh, kb = divmod(whole + t, n_k)
        keys = slice(kb * block_n, min((kb + 1) * block_n, Lk))
        n = keys.stop - keys.start
        want[:, bh // H, bh % H, keys] = sums[t, :, :n].to(torch.bfloat16)
    # (the interpreter rounds float32 to bfloat16 toward zero: within one unit in the last place)
    torch.testing.assert_close(grads.float(), want.float(), rtol=2**-7, atol=0)
    written = want != before[..., :D].permute(0, 1, 3, 2, 4)
    assert torch.equal(grads[~written], want[~written])
    assert torch.equal(storage[..., D:], before[..., D:])


def test_tail_is_refused_where_it_does_not_apply():
    t = torch.zeros(1, 1, 64, 64, dtype=torch.bfloat16)
    for kwargs in ({"causal": True, "dq": t.float()}, {}):
        with pytest.raises(ValueError, match="tail: only a non-causal fused launch"):
            dkdv(t, t, t, t[..., 0].float(), t, t[..., 0].float(), torch.empty(2, 1, 1, 64, 64), 0.125,
                 tail=(1, 2), **kwargs)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize(("BH", "Lq", "Lk", "tail"), [
    (3, 1100, 1000, (5, 4)),  # part of the heads' blocks, query chunks of 4-5 tiles
    (2, 257, 1017, (16, 3)),  # every block split; 5 query tiles in 3 chunks
    (2, 1000, 999, (1, 8)),  # the ragged last block alone, 16 tiles in 8 chunks
    (1, 64, 300, (3, 2)),  # one query tile: a chunk with no tiles adds zeros
])  # fmt: skip
def test_split_tail_matches_float64(BH, Lq, Lk, tail):
    """dkdv(tail=...): the fused backward with its last key blocks run as query chunks whose dK, dV
    add up in float32 -- against float64, and the same as without the split to float32 rounding."""
    D = 64
    q, k, v, do = (torch.randn(BH, n, D, device="cuda", dtype=torch.bfloat16) for n in (Lq, Lk, Lk, Lq))
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    reference_attention(*ref)[0].backward(do.double())
    o, lse = flash_forward(q, k, v, False)
    delta = backward_delta(o, do)
    heads = [t.unsqueeze(1) for t in (q, k, v, lse, do, delta)]
    got = {}
    for split in (tail, (0, 1)):
        grads = torch.full((2, BH, 1, Lk, D), float("nan"), dtype=torch.bfloat16, device="cuda")
        dq = torch.zeros((BH, 1, Lq, D), dtype=torch.float32, device="cuda")
        dkdv(*heads, grads, D**-0.5, dq=dq, tail=split)
        got[split] = (dq[:, 0], grads[0, :, 0], grads[1, :, 0])
    for name, split_, whole, want in zip("qkv", got[tail], got[(0, 1)], ref, strict=True):
        assert torch.isfinite(split_).all(), name
        assert rel_err(split_, want.grad) < 1e-2, name
        assert rel_err(split_, whole) < 1e-2, name
