"""A timeline of the Gluon FP8 forward's programs at mid: ``fp8_hopper`` with %globaltimer read by
each softmax warpgroup at six points -- its start, Q quantised, tile 0 done, the main loops done,
the last P V product done, O stored -- and the SM it ran on, written to a side buffer (the kernel
is otherwise unchanged). Printed: the mean time of each phase, how long a program takes from its
first warpgroup's start to its last one's end, and the gap on an SM between one program's end
and the next one's start.

    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/fp8_timeline.py [keys]
"""

import pathlib
import sys

MARK = """
@gluon.jit
def _mark(DBG, slot, k):
    t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [slot], dtype=gl.int64, is_pure=False, pack=1)
    gl.store(DBG + slot * 8 + k, t)


@gluon.jit
def _fp8_softmax_partition("""

EDITS = [
    ("\n@gluon.jit\ndef _fp8_softmax_partition(", MARK),
    (
        "VS, VM, O, LSE,\n                           qk_scale,",
        "VS, VM, O, LSE, DBG,\n                           qk_scale,",
    ),
    (
        "    row_scale = qk_scale * _quantized_q(q_smem, q8_smem, q_bar)\n",
        "    slot = gl.program_id(0) * 3 + (row_start % (3 * ROWS)) // ROWS\n"
        "    _mark(DBG, slot, 0)\n"
        "    smid = gl.inline_asm_elementwise('mov.u32 $0, %smid;', '=r,r', [row_start], dtype=gl.int32, is_pure=False, pack=1)\n"
        "    gl.store(DBG + slot * 8 + 7, smid.to(gl.int64))\n"
        "    row_scale = qk_scale * _quantized_q(q_smem, q8_smem, q_bar)\n"
        "    _mark(DBG, slot, 1)\n",
    ),
    ("    # The last tile, if Lk ends", "    _mark(DBG, slot, 2)\n    # The last tile, if Lk ends"),
    ("    last = (n_tiles - 1) % STAGES\n", "    _mark(DBG, slot, 3)\n    last = (n_tiles - 1) % STAGES\n"),
    (
        "    store_rows(acc * gl.convert_layout",
        "    _mark(DBG, slot, 4)\n    store_rows(acc * gl.convert_layout",
    ),
    (
        "q_desc, k_desc, vt_desc, KS, VS, VM, O, LSE, qk_scale,",
        "q_desc, k_desc, vt_desc, KS, VS, VM, O, LSE, DBG, qk_scale,",
    ),
    ("empty_bars, KS, VS, VM, O, LSE, qk_scale,", "empty_bars, KS, VS, VM, O, LSE, DBG, qk_scale,"),
    (
        "(*descriptors, k_scales, v_scales, v_means, o, lse),",
        "(*descriptors, k_scales, v_scales, v_means, o, lse, DBG_BUFFER[0]),",
    ),
]
# After store_rows (its call spans lines: the mark goes after its closing line).
END = "stride_ob, stride_oh, stride_ol, b, h, bh, row_start, Lq)  # fmt: skip\n"


def with_marks(source: str) -> str:
    for old, new in EDITS:
        assert old in source, old
        source = source.replace(old, new)
    assert source.count(END) == 1
    return source.replace(END, END + "    _mark(DBG, slot, 5)\n") + "\nDBG_BUFFER = [None]\n"


def main():
    import torch

    from tritonlab.attention import fp8
    from tritonlab.attention._common import LOG2E
    from tritonlab.attention.forward import _forward_outputs

    lk = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from fp8_mid_overheads import LQ, B, D, H, strided
    from patched import load_patched

    timeline = load_patched("fp8_hopper.py", "fp8_hopper_timeline", with_marks)

    q, k, v = strided(LQ), strided(lk), strided(lk)
    programs = B * H * -(-LQ // timeline.BLOCK_M)
    dbg = torch.zeros(programs, 3, 8, dtype=torch.int64, device="cuda")
    timeline.DBG_BUFFER[0] = dbg
    parts = fp8._quantize_kv(k, v)
    o, lse = _forward_outputs(q)
    for _ in range(3):  # the last run's marks stay
        timeline.forward(q, *parts, o, lse, D**-0.5 * LOG2E, fp8.KV_BLOCK, lk)
    torch.cuda.synchronize()
    t = dbg[..., :6].double().cpu()
    t = (t - t.min()) / 1e3  # µs from the first mark
    sm = dbg[:, 0, 7].cpu()
    phases = t.diff(dim=-1).mean(dim=(0, 1))
    names = ["Q quantised", "tile 0", "main loops", "last P V", "O stored"]
    print(f"{programs} programs, Lk {lk}, kernel span {t.max():.1f} us (first mark to last)")
    for name, ms in zip(names, phases.tolist(), strict=True):
        print(f"  {name:12s} {ms:7.2f} us a warpgroup (mean)")
    start, end = t[:, :, 0].min(dim=1).values, t[:, :, 5].max(dim=1).values
    print(f"  a program, first start to last end: mean {(end - start).mean():.2f} us")
    spread = t[:, :, 0].max(dim=1).values - start
    print(f"  its warpgroups' starts spread over {spread.mean():.2f} us (mean)")
    gaps = []
    for s in sm.unique().tolist():
        order = start[sm == s].argsort()
        st, en = start[sm == s][order], end[sm == s][order]
        gaps += (st[1:] - en[:-1]).tolist()
    gaps = torch.tensor(gaps)
    print(
        f"  gap on an SM, one program's end to the next one's start: mean {gaps.mean():.2f} us, "
        f"median {gaps.median():.2f}, max {gaps.max():.2f}; {sm.unique().numel()} SMs, "
        f"{programs / sm.unique().numel():.2f} programs an SM"
    )
    first_wave = start.sort().values[:132]
    print(f"  first 132 starts within {first_wave[-1] - first_wave[0]:.2f} us; last end {end.max():.1f} us")


if __name__ == "__main__":
    main()
