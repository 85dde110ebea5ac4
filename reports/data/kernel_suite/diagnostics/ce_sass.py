"""Diagnostic, no GPU needed: the cross-entropy forward kernel built for sm_90a on the CPU (Triton's
ptxas and cuobjdump), bf16 logits at 16384 x 128256 as the GPU specialises them (16-byte aligned
pointers, sizes and strides divisible by 16), each module at its own launch settings. For each option
set: registers, spill bytes, barriers, and the instructions of each sweep's loop per logit a thread
(the loops are the backward branches of the SASS; a thread holds BLOCK_V / (32 * warps) logits a
block). ``before``: c40aa9a's tritonlab/ops/cross_entropy.py as ``ce_head`` in the folder given as
the first argument (relative imports made absolute); ``now``: the tree's.

    python reports/data/kernel_suite/diagnostics/ce_sass.py DIR_WITH_CE_HEAD
"""

import collections
import importlib
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tritonlab.tuning import ptxas_report, sass

sys.path.insert(0, sys.argv[1])
MODULES = {
    "before": importlib.import_module("ce_head"),
    "now": importlib.import_module("tritonlab.ops.cross_entropy"),
}
OPTIONS = {
    "plain": {},
    "smoothing": dict(HAS_SMOOTHING=True),
    "softcap": dict(HAS_SOFTCAP=True),
    "zloss": dict(HAS_ZLOSS=True),
    "all": dict(HAS_SMOOTHING=True, HAS_SOFTCAP=True, HAS_ZLOSS=True),
}
ALIGNED = ("LOGITS", "TARGET", "LOSS", "GRAD", "N_VALID", "n_rows", "n_cols", "stride_logits", "stride_grad")


def loops(text: str) -> list[int]:
    """Instruction counts of the SASS's loops, in address order (a loop: a branch back)."""
    ins = [(int(a, 16), op) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", text)]
    counts = []
    for addr, op in ins:
        back = re.search(r"BRA (0x[0-9a-f]+)", op)
        if back and int(back.group(1), 16) < addr:
            counts.append(sum(1 for a, _ in ins if int(back.group(1), 16) <= a <= addr))
    return counts


for which, ce in MODULES.items():
    kernel = ce._cross_entropy_fwd_kernel
    for name, opts in OPTIONS.items():
        softcap = 30.0 if opts.get("HAS_SOFTCAP") else None
        settings = ce.launch_settings(softcap)
        block = settings.block_v(2)
        consts = dict(MEAN=True, COMPUTE_GRAD=True, BLOCK_V=block)
        if opts:
            consts.update(
                WEIGHT=None, WEIGHT_STATS=None, HAS_WEIGHT=False, HAS_SMOOTHING=False, HAS_SOFTCAP=False
            )
            consts.update(HAS_ZLOSS=False, FAST_TANH=True, FIXED_MAX=settings.uses_fixed_max(softcap))
            consts.update(opts)
        if "TILE_COLS" in kernel.arg_names:
            consts.update(TARGET_FIXUP=settings.target_fixup, TILE_COLS=settings.tile_cols(2))
        sig = {n: "i32" for n in kernel.arg_names}
        sig.update(
            LOGITS="*bf16", TARGET="*i64", LOSS="*fp32", GRAD="*bf16", N_VALID="*i32", smoothing="fp32"
        )
        sig.update(softcap="fp32", lse_square_scale="fp32", stride_logits="i64", stride_grad="i64")
        if not opts:  # the plain loss's signature: the parameters before the options
            sig = {
                n: t for n, t in sig.items() if kernel.arg_names.index(n) < kernel.arg_names.index("WEIGHT")
            }
            consts = {n: v for n, v in consts.items() if n in sig or n in ("TARGET_FIXUP",)}
        sig.update({c: "constexpr" for c in consts})
        attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in ALIGNED}
        out = triton.compile(
            ASTSource(kernel, signature=sig, constexprs=consts, attrs=attrs),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": settings.num_warps},
        )
        text = sass(out.asm["ptx"], "sm_90a")
        report = ptxas_report(out.asm["ptx"], "sm_90a")
        per_thread = block / (32 * settings.num_warps)
        inner = loops(text)[:2]  # sweep 1, sweep 2 (the row loop around them comes last)
        mufu = dict(collections.Counter(re.findall(r"MUFU\.(\w+)", text)))
        print(
            f"{which:6s} {name:9s} block {block:5d} warps {settings.num_warps} registers {report['registers']} "
            f"spills {report['spill_stores']:4d} B  barriers {len(re.findall('BAR.SYNC', text)):2d}  "
            f"instructions a logit: sweep 1 {inner[0] / per_thread:5.1f}, sweep 2 {inner[1] / per_thread:5.1f}  "
            f"MUFU {mufu}",
            flush=True,
        )
