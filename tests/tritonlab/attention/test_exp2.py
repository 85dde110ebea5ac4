"""The forwards' exp2 with one element in EXP2_SPLIT on the FMA units: the method's accuracy (on the
CPU, in torch ops that mirror the PTX) and the sm_90 build (fewer special-function ops, no spills).
The PTX itself runs in the GPU tests of every forward (its default on a GPU for 16-bit inputs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from tritonlab._runtime import INTERPRET
from tritonlab.attention._common import EXP2_SPLITS, _exp2_split_asm, exp2_split, exp2_split_reference

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def test_the_polynomial_is_within_its_stated_relative_error_over_the_softmax_range():
    x = torch.cat([-torch.rand(200_000, dtype=torch.float64) * 126, torch.tensor([0.0, -0.5, -1.0, -125.9])])
    rel = (exp2_split_reference(x).double() / torch.exp2(x) - 1).abs()
    assert rel.max().item() < 7.8e-5  # the fit's 7.5e-5, plus float32 rounding


def test_scores_below_the_exponent_range_stay_finite_and_tiny():
    y = exp2_split_reference(torch.tensor([-126.0, -200.0, float("-inf")]))
    assert torch.isfinite(y).all() and (y >= 0).all() and (y < 2e-38).all()


def test_the_asm_takes_the_last_element_of_each_pack_to_the_polynomial():
    for pack in (2, 4, 8):
        asm = _exp2_split_asm(pack)
        assert asm.count("ex2.approx") == pack - 1 and asm.count("fma.rn") == 3
        assert f"add.s32 ${pack - 1}," in asm and f"${2 * pack - 1}," in asm


def test_float32_and_the_interpreter_keep_every_exp2_exact():
    assert exp2_split(torch.float32) == 0
    assert exp2_split(torch.bfloat16) == (0 if INTERPRET else 4)  # the interpreter runs no PTX
    assert 4 in EXP2_SPLITS


_BUILD = r"""
import json, re, subprocess, sys, tempfile
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tritonlab.attention.forward import _attn_fwd_kernel

bin_dir = Path(sys.argv[1])
out = {}
for split in (0, 4):
    consts = dict(HEAD_DIM=64, BLOCK_M=128, BLOCK_N=64, GROUP_BH=1, USE_TMA=False, WARP_SPECIALIZE=False,
                  DOT_PRECISION="tf32", EXP2_SPLIT=split)
    sig = {n: "i32" for n in _attn_fwd_kernel.arg_names}
    sig.update(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", LSE="*fp32", qk_scale="fp32",
               **{c: "constexpr" for c in consts})
    compiled = triton.compile(ASTSource(_attn_fwd_kernel, signature=sig, constexprs=consts),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(compiled.asm["ptx"])
        cubin = ptx.with_suffix(".cubin")
        report = subprocess.run([str(bin_dir / "ptxas"), "-v", "--gpu-name=sm_90a", str(ptx), "-o", str(cubin)],
                                capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([str(bin_dir / "cuobjdump"), "-sass", str(cubin)],
                              capture_output=True, text=True, check=True).stdout
    out[split] = {"mufu_ex2": len(re.findall(r"MUFU\.EX2", sass)),
                  "spill_bytes": sum(int(n) for n in re.findall(r"(\d+) bytes spill", report)),
                  "registers": int(re.search(r"Used (\d+) registers", report).group(1))}
print(json.dumps(out))
"""


@pytest.mark.skipif(
    not (BIN / "ptxas").exists() or not (BIN / "cuobjdump").exists(), reason="needs Triton's bundled ptxas"
)
def test_the_bf16_forward_builds_for_sm90_with_a_quarter_fewer_exponentials_in_its_loop():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", _BUILD, str(BIN)], capture_output=True, text=True, env=env,
                         cwd=root, check=True)  # fmt: skip
    built = {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    # 128 x 64 tile, 256 threads: 32 scores a thread in the loop, 32 in the tail, 4 row rescales.
    assert built[0]["mufu_ex2"] == 68 and built[4]["mufu_ex2"] == 68 - 8
    assert all(b["spill_bytes"] == 0 and b["registers"] <= 255 for b in built.values()), built
