"""tritonlab.tuning: the ptxas report (registers and spills of a kernel built for a GPU not present)
and the fingerprint of a SASS listing."""

import json

import pytest

from tritonlab.testing import run_without_interpreter, triton_tools_missing
from tritonlab.tuning import fingerprint, parse_ptxas_log

_REPORT = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tritonlab.attention._common import _delta_kernel as kernel
from tritonlab.tuning import ptxas_report

consts = {"HEAD_DIM": 64, "BLOCK_M": 64}
signature = {n: "i32" for n in kernel.arg_names}
signature.update(O="*bf16", DO="*bf16", DELTA="*fp32", ZERO="*fp32", **{c: "constexpr" for c in consts})
out = {}
for arch, name in ((80, "sm_80"), (90, "sm_90a")):
    built = triton.compile(ASTSource(kernel, signature, consts), target=GPUTarget("cuda", arch, 32),
                           options={"num_warps": 4})
    out[name] = ptxas_report(built.asm["ptx"], name)
print(json.dumps(out))
"""


@pytest.mark.skipif(triton_tools_missing("ptxas"), reason="needs Triton's bundled ptxas")
def test_ptxas_report_builds_for_each_target():
    # Phase 11's A100 check builds for sm_80, the tests' FP8 and cross-entropy checks for sm_90a.
    reports = json.loads(run_without_interpreter(_REPORT).stdout.strip().splitlines()[-1])
    for name in ("sm_80", "sm_90a"):
        report = reports[name]
        assert set(report) == {"registers", "spill_stores", "spill_loads"}
        assert 0 < report["registers"] <= 255 and report["spill_stores"] >= 0 and report["spill_loads"] >= 0


_LOG = """ptxas info    : Compiling entry function 'k' for 'sm_90a'
ptxas info    : Function properties for helper
    8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers
ptxas info    : Function properties for k
    0 bytes stack frame, 20 bytes spill stores, 20 bytes spill loads
ptxas info    : Used 80 registers, 392 bytes cmem[0]
"""


def test_the_log_gives_the_most_registers_and_the_total_spills():
    assert parse_ptxas_log(_LOG) == {"registers": 80, "spill_stores": 28, "spill_loads": 24}


def test_a_log_without_a_report_is_an_error_showing_it():
    with pytest.raises(RuntimeError, match="no register report"):
        parse_ptxas_log("ptxas fatal   : Unresolved extern function")


_LISTING = """
        /*0000*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;    /* 0x00000a00ff017624 */
        /*0010*/                   STL.64 [R1+0x10], R4 ;                     /* 0x0000100401007387 */
        /*0020*/               @!P0 BRA 0x80 ;                                /* 0x0000000000008947 */
        /*fff0*/                   LDL.64 R6, [R1+0x10] ;                     /* 0x0000100001067983 */
        /*10000*/                  R2UR UR4, R6 ;                             /* 0x00000000060472ca */
"""


def test_a_fingerprint_ignores_register_and_spill_slot_assignment_but_not_instructions():
    same = _LISTING.replace("R4", "R8").replace("0x10]", "0x18]").replace("UR4", "UR6").replace("P0", "P2")
    assert fingerprint(_LISTING) == fingerprint(same)
    assert fingerprint(_LISTING)["instructions"] == 5  # five-digit addresses counted too
    moved = _LISTING.replace("LDL.64 R6, [R1+0x10] ;", "LDL.64 R6, [R1] ;").replace(
        "[R1+0x10], R4", "[R1], R4"
    )
    assert fingerprint(moved) == fingerprint(_LISTING)  # the slot is a name, the instruction the same
    other = _LISTING.replace("@!P0 BRA 0x80", "@P0 BRA 0x80")
    reordered = (
        _LISTING.replace("@!P0 BRA 0x80 ;", "#")
        .replace("R2UR UR4, R6 ;", "@!P0 BRA 0x80 ;")
        .replace("#", "R2UR UR4, R6 ;")
    )
    assert fingerprint(other) != fingerprint(_LISTING) and fingerprint(reordered) != fingerprint(_LISTING)
