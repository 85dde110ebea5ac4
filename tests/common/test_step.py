"""common.step's GPU time by kernel family: the names of a TransformerNP step's kernels land in their
families, and the busy time is the union of the kernel intervals, per step."""

import pytest
import torch

from common.step import KERNEL_FAMILIES, kernel_family, profile_gpu_time, summarize_kernels


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("_dkdv_kernel", "attention"),
        ("_attn_fwd_hopper_kernel", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64", "attention"),
        (
            "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64>>",
            "attention",
        ),
        ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*)", "attention"),
        ("_fused_mlp_staged_kernel", "mlp"),
        ("_silu_backward_kernel", "mlp"),
        ("mlp_hidden_kernel", "heads"),
        ("fused_mlp_fwd_kernel", "heads"),
        ("_gmm_nll_bwd_kernel", "loss"),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
            "optimizer",
        ),
        ("nvjet_sm90_tst_128x192_64x5_2x1_v_bz_coopB_NNN", "gemm"),
        ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_64x64_tn_align1>", "gemm"),
        # Inductor's names carry the ops they fuse: they are Inductor's, not our SiLU backward's.
        ("triton_poi_fused__unsafe_view_mm_silu_silu_backward_view_22", "inductor"),
        ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_7", "inductor"),
        ("Memcpy DtoD (Device -> Device)", "memcpy"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "elementwise"),
        ("some_kernel_of_a_library", "other"),
    ],
)
def test_kernel_names_land_in_their_family(name, family):
    assert kernel_family(name) == family


def test_busy_time_is_the_union_of_the_intervals_per_step():
    kernels = [
        ("_dkdv_kernel", 0.0, 100.0),
        ("nvjet_sm90_x", 50.0, 150.0),  # overlaps the first: 50 us more busy, 100 more kernel time
        ("triton_poi_fused_add_0", 300.0, 310.0),  # after a 150 us gap
        ("_dkdv_kernel", 1000.0, 1100.0),
    ]
    row = summarize_kernels(kernels, steps=2)
    assert row["gpu_busy_ms"] == pytest.approx((150 + 10 + 100) / 1e3 / 2)
    assert row["gpu_kernel_ms"] == pytest.approx((100 + 100 + 10 + 100) / 1e3 / 2)
    assert row["gpu_launches"] == 2
    assert row["gpu_attention_ms"] == pytest.approx(0.1)
    assert row["gpu_gemm_ms"] == pytest.approx(0.05)
    assert row["gpu_inductor_ms"] == pytest.approx(0.005)
    families = {f for f, _ in KERNEL_FAMILIES} | {"other"}
    assert {k for k in row if k.endswith("_ms")} == {"gpu_busy_ms", "gpu_kernel_ms"} | {
        f"gpu_{f}_ms" for f in families
    }
    assert summarize_kernels([], steps=3)["gpu_busy_ms"] == 0


def test_without_cuda_or_steps_nothing_is_profiled():
    calls = []
    assert profile_gpu_time(lambda: calls.append(1), 0) == {}
    row = profile_gpu_time(lambda: calls.append(1), 3)
    if torch.cuda.is_available():
        assert len(calls) == 3 and row["gpu_launches"] == 0  # the steps launched nothing
    else:
        assert row == {} and calls == []
