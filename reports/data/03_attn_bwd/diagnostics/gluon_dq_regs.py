"""A Gluon dQ kernel (the one dropped at 905d012: 2.22 against Triton's 2.05 ms at mid, at 168 registers)
with the second MMA warpgroup's registers (REGS) and the key tile (BLOCK_N) as parameters, timed alone
against the two-pass backward's Triton dQ kernel at the mid shape (model layout, bf16, D = 64), dQ
compared with the Triton kernel's. Built for sm_90a first (spills). Run with PYTHONPATH at the repo root."""

import sys

import torch
import triton
from torch.profiler import ProfilerActivity, profile
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from tritonlab._gluon import mma_layout
from tritonlab.attention import attention
from tritonlab.attention._common import LOG2E, backward_delta
from tritonlab.attention.forward import attention_forward
from tritonlab.attention.forward_hopper import descriptor
from tritonlab.testing import model_qkv


@gluon.jit
def _dq_load(q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, k_bufs, v_bufs, qd_bars, ready_bars, empty_bars,
             b, h, row_start, n_tiles, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    for w in gl.static_range(2):
        mbarrier.expect(qd_bars.index(w), 2 * q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            q_desc, [b, h, row_start + w * 64, 0], qd_bars.index(w), q_bufs.index(w)
        )
        tma.async_copy_global_to_shared(
            do_desc, [b, h, row_start + w * 64, 0], qd_bars.index(w), do_bufs.index(w)
        )
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(empty_bars.index(slot), ((j // STAGES) + 1) & 1, pred=j >= STAGES)
        bar = ready_bars.index(slot)
        mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, h, j * BLOCK_N, 0], bar, k_bufs.index(slot))
        tma.async_copy_global_to_shared(v_desc, [b, h, j * BLOCK_N, 0], bar, v_bufs.index(slot))


@gluon.jit
def _dq_compute(q_smem, do_smem, qd_bar, k_bufs, v_bufs, ready_bars, empty_bars, LSE, DELTA, DQ, scale, qk_scale,
                stride_qb, stride_qh, stride_ql, b, h, pid_bh, row_start, Lq, Lk, n_tiles):  # fmt: skip
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[3]
    HEAD_DIM: gl.constexpr = k_bufs.shape[4]
    QROWS: gl.constexpr = q_smem.shape[2]
    dtype: gl.constexpr = k_bufs.dtype
    s_layout: gl.constexpr = mma_layout(BLOCK_N)
    g_layout: gl.constexpr = mma_layout(HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=g_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)

    q = q_smem.reshape([QROWS, HEAD_DIM])
    do = do_smem.reshape([QROWS, HEAD_DIM])
    s_zero = gl.zeros([QROWS, BLOCK_N], gl.float32, s_layout)
    dq = gl.zeros([QROWS, HEAD_DIM], gl.float32, g_layout)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    r = row_start + gl.arange(0, QROWS, layout=s_rows)
    stats = pid_bh.to(gl.int64) * Lq
    lse2 = gl.load(LSE + stats + r, mask=r < Lq, other=float("inf")) * 1.4426950408889634
    delta = gl.load(DELTA + stats + r, mask=r < Lq, other=0.0)
    mbarrier.wait(qd_bar, 0)
    for j in range(n_tiles):
        slot = j % STAGES
        mbarrier.wait(ready_bars.index(slot), (j // STAGES) & 1)
        k_tile = k_bufs.index(slot).reshape([BLOCK_N, HEAD_DIM])
        v_tile = v_bufs.index(slot).reshape([BLOCK_N, HEAD_DIM])
        s_tok = warpgroup_mma(q, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(do, v_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        s = s * qk_scale - lse2[:, None]
        if (j + 1) * BLOCK_N > Lk:
            s = gl.where((j * BLOCK_N + cols < Lk)[None, :], s, float("-inf"))
        p = gl.exp2(s)
        dp = warpgroup_mma_wait(0, deps=[dp_tok])
        ds_a = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), a_layout)
        dq_tok = warpgroup_mma(ds_a, k_tile, dq, is_async=True)
        dq, ds_a = warpgroup_mma_wait(0, deps=[dq_tok, ds_a])
        mbarrier.arrive(empty_bars.index(slot), count=1)

    rows = row_start + gl.arange(0, QROWS, layout=gl.SliceLayout(1, g_layout))
    dcols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, g_layout))
    offs = b.to(gl.int64) * stride_qb + h.to(gl.int64) * stride_qh + rows.to(gl.int64)[:, None] * stride_ql
    gl.store(DQ + offs + dcols[None, :], (dq * scale).to(dtype), mask=(rows < Lq)[:, None])


@gluon.jit
def _dq_kernel(
    q_desc, k_desc, v_desc, do_desc, LSE, DELTA, DQ, scale, qk_scale,
    stride_qb, stride_qh, stride_ql, H, Lq, Lk,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, REGS: gl.constexpr,
):  # fmt: skip
    dtype: gl.constexpr = q_desc.dtype
    n_m = gl.cdiv(Lq, 128)
    pid = gl.program_id(0)
    pid_bh = pid // n_m
    row_start = (pid % n_m) * 128
    b = pid_bh // H
    h = pid_bh % H
    n_tiles = gl.cdiv(Lk, BLOCK_N)

    q_bufs = gl.allocate_shared_memory(dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [2] + do_desc.block_type.shape, do_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    qd_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(qd_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=2)

    gl.warp_specialize(
        [
            (_dq_compute, (q_bufs.index(0), do_bufs.index(0), qd_bars.index(0), k_bufs, v_bufs, ready_bars, empty_bars,
                           LSE, DELTA, DQ, scale, qk_scale, stride_qb, stride_qh, stride_ql, b, h, pid_bh, row_start,
                           Lq, Lk, n_tiles)),
            (_dq_compute, (q_bufs.index(1), do_bufs.index(1), qd_bars.index(1), k_bufs, v_bufs, ready_bars, empty_bars,
                           LSE, DELTA, DQ, scale, qk_scale, stride_qb, stride_qh, stride_ql, b, h, pid_bh,
                           row_start + 64, Lq, Lk, n_tiles)),
            (_dq_load, (q_desc, do_desc, k_desc, v_desc, q_bufs, do_bufs, k_bufs, v_bufs, qd_bars, ready_bars,
                        empty_bars, b, h, row_start, n_tiles, BLOCK_N, STAGES)),
        ],
        [4, 1],
        [REGS, 24],
    )  # fmt: skip


CONFIGS = [(64, 2, 168), (64, 2, 240), (64, 3, 240), (128, 2, 240), (128, 3, 240)]  # (BLOCK_N, STAGES, REGS)


def build_report():
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from tritonlab.testing import hopper_descriptor_type as desc
    from tritonlab.tuning import ptxas_report

    for block_n, stages, regs in CONFIGS:
        sig = {"q_desc": desc(64, 64), "k_desc": desc(block_n, 64), "v_desc": desc(block_n, 64),
               "do_desc": desc(64, 64), "LSE": "*fp32", "DELTA": "*fp32", "DQ": "*bf16", "scale": "fp32",
               "qk_scale": "fp32", "stride_qb": "i32", "stride_qh": "i32", "stride_ql": "i32", "H": "i32",
               "Lq": "i32", "Lk": "i32", "HEAD_DIM": "constexpr", "BLOCK_N": "constexpr", "STAGES": "constexpr",
               "REGS": "constexpr"}  # fmt: skip
        consts = {"HEAD_DIM": 64, "BLOCK_N": block_n, "STAGES": stages, "REGS": regs}
        out = triton.compile(
            GluonASTSource(_dq_kernel, sig, consts),
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": 4},
        )
        print(
            (block_n, stages, regs), out.metadata.shared, ptxas_report(out.asm["ptx"], "sm_90a"), flush=True
        )


def kernel_ms(fn, name):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    times = [e.device_time_total / e.count / 1000 for e in prof.key_averages() if e.key.startswith(name)]
    return times[0] if times else float("nan")


def gluon_dq(q, k, v, lse, do, delta, dq, scale, config):
    B, H, Lq, D = q.shape
    block_n, stages, regs = config
    _dq_kernel[(triton.cdiv(Lq, 128) * B * H,)](
        descriptor(q, 64), descriptor(k, block_n), descriptor(v, block_n), descriptor(do, 64), lse, delta, dq,
        float(scale), float(scale * LOG2E), dq.stride(0), dq.stride(1), dq.stride(2), H, Lq, k.shape[2],
        HEAD_DIM=D, BLOCK_N=block_n, STAGES=stages, REGS=regs, num_warps=4,
    )  # fmt: skip


def measure(B, H, Lq, Lk, D=64):
    q, k, v = (t.detach().requires_grad_() for t in model_qkv(B, H, Lq, Lk, D, torch.bfloat16))
    do = torch.randn(B, H, Lq, D, device="cuda", dtype=torch.bfloat16)
    o = attention(q, k, v)
    o.backward(do)
    dq_ref = q.grad.clone()
    triton_ms = kernel_ms(lambda: torch.autograd.grad(attention(q, k, v), (q, k, v), do), "_dq_kernel")
    print(f"B={B} H={H} Lq={Lq} Lk={Lk} D={D}: triton dQ {triton_ms:.3f} ms", flush=True)
    o, lse = attention_forward(q.detach(), k.detach(), v.detach())
    delta = backward_delta(o, do)
    dq = torch.empty_like(dq_ref)
    for config in CONFIGS:
        dq.fill_(float("nan"))
        gluon_dq(q.detach(), k.detach(), v.detach(), lse, do, delta, dq, D**-0.5, config)
        err = ((dq.float() - dq_ref.float()).norm() / dq_ref.float().norm()).item()
        ms = kernel_ms(
            lambda config=config: gluon_dq(
                q.detach(), k.detach(), v.detach(), lse, do, delta, dq, D**-0.5, config
            ),
            "_dq_kernel",
        )
        print(f"   gluon {config}: {ms:.3f} ms ({triton_ms / ms:.3f}x triton), rel err {err:.2e}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["build"]:
        build_report()
    else:
        measure(4, 8, 11000, 10000)
        measure(1, 8, 55000, 50000)
