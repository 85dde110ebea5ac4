"""What the phases' tests share: a small Nsight Compute profile as ``python -m common.ncu`` writes it
(for the reports), the calls an attention phase's ncu pass hands to the profiler, and an attention
phase's benchmark rows."""

import pandas as pd
import pytest
import torch

import common.attention_bench as attention_bench
import common.ncu as ncu
from common import ResultWriter
from common.ncu import SUBDIR
from phases.__main__ import phase_module

# (kernel, time_ms, tensor_pct, issue_pct, stalls): cuDNN's call, then each of ours.
CUDNN_KERNELS = [
    ("cudnn_fprop", 2.0, 50.0, 40.0, "selected 1.00, long_scoreboard 1.20, barrier 0.80"),
    ("dot_do_o", 0.05, 0.0, 10.0, "long_scoreboard 40.00"),
]
OUR_KERNEL = ("_our_kernel", 2.5, 40.0, 30.0, "barrier 2.00, wait 1.00")


class NcuProfile:
    @staticmethod
    def write(phase: str, shape: str, ours: list[str]) -> str:
        """A profile of SDPA cuDNN (two kernels) and each variant of ``ours`` (one kernel) under the
        test's data directory; returns the GPU its rows name."""
        writer = ResultWriter(phase, subdir=SUBDIR)
        calls = {"sdpa-cudnn": CUDNN_KERNELS, **{name: [OUR_KERNEL] for name in ours}}
        for variant, kernels in calls.items():
            for kernel, time_ms, tensor_pct, issue_pct, stalls in kernels:
                writer.write(
                    {"variant": variant, "kernel": kernel, "time_ms": time_ms, "tensor_pct": tensor_pct,
                     "issue_pct": issue_pct, "stalls": stalls, "shape": shape, "dtype": "bfloat16"}
                )  # fmt: skip
        return writer.rows[0]["gpu"]

    @staticmethod
    def comparison(name: str) -> str:
        """The sentence a report prints for our variant ``name``, worked out by hand: cuDNN's
        counters weighted by its kernels' times (50·2 + 0·0.05) / 2.05 = 49%, (40·2 + 10·0.05) / 2.05 =
        39%; its longest kernel's largest stall skips ``selected``."""
        return (
            f"`{name}` runs 2.50 ms in 1 kernel against `sdpa-cudnn`'s 2.05 ms in 2 (1.22× its time); "
            "weighted by kernel time, the tensor pipe is busy 40% of active cycles against 49%, a scheduler "
            "issues in 30% of cycles against 39%; its longest kernel (`_our_kernel`, 2.50 ms) stalls most on "
            "`barrier` (2.00 cycles per issued instruction), `sdpa-cudnn`'s (`cudnn_fprop`, 2.00 ms) on "
            "`long_scoreboard` (1.20)."
        )

    @classmethod
    def check_report(cls, report, df, fig, phase: str, ours: list[str]) -> None:
        """``report`` renders a one-line "not profiled yet" section without rows, and with a profile
        of cuDNN and ``ours`` (written here) its table and each of ``ours``' comparison sentences."""
        none = f"_Not profiled yet: `phases/{phase}/ncu_pass.py` has the two commands._"
        assert none in report.REPORT.render(df, fig)
        gpu = cls.write(phase, "mid", ours)
        section = report.REPORT.render(df.assign(gpu=gpu), fig).split(
            "## Where the time goes (Nsight Compute)"
        )[1]
        assert none not in section and "| _our_kernel " in section and "| cudnn_fprop " in section
        for name in ours:
            assert cls.comparison(name) in section


@pytest.fixture
def ncu_profile() -> NcuProfile:
    return NcuProfile()


@pytest.fixture
def attention_ncu_calls(monkeypatch):
    """``collect(phase, backward)``: what ``phase``'s ncu pass profiles at the tiny shape, collected,
    not run, after checking that without a GPU it refuses; each call's inputs are the benchmark's
    (bf16, Lq 48, Lk 37, D 64), with gradients where it profiles the backward."""

    def collect(phase: str, backward: bool) -> dict:
        ncu_pass = phase_module(phase, "ncu_pass")
        monkeypatch.setattr(ncu, "ON_GPU", False)
        with pytest.raises(SystemExit, match="needs a CUDA GPU"):
            ncu_pass.main([])
        monkeypatch.setattr(ncu, "ON_GPU", True)
        profiled = {}
        monkeypatch.setattr(attention_bench, "profile_once", profiled.update)
        ncu_pass.main(["--shape", "tiny"])
        for call in profiled.values():
            fn, q, k, v, do, backward_ = call.args
            assert q.shape == (2, 8, 48, 64) and k.shape == (2, 8, 37, 64) and q.dtype == torch.bfloat16
            assert backward_ is backward and q.requires_grad is backward
        return {name: call.args[0] for name, call in profiled.items()}

    return collect


@pytest.fixture
def attention_rows():
    """``rows(ms_by_variant, shape="mid", mode="fwd+bwd")``: an attention phase's ok rows, one a
    variant, of one run on an H100."""

    def rows(ms_by_variant: dict, shape: str = "mid", mode: str = "fwd+bwd") -> pd.DataFrame:
        return pd.DataFrame(
            [{"variant": v, "shape": shape, "dtype": "bf16", "mode": mode, "status": "ok", "ms": ms,
              "gpu": "H100", "utc": "2026-11-22", "run_group": "g"}
             for v, ms in ms_by_variant.items()]
        )  # fmt: skip

    return rows
