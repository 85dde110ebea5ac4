"""Phase kernel_suite's report: the headline verdicts take ours against the fastest baseline of the
same run at each op's largest size, and the tables render."""

import pandas as pd

from common.report import Figures
from phases.__main__ import phase_module


def gpu_rows() -> pd.DataFrame:
    rows = []
    for kernel, passes in (("rms_norm", ("fwd", "fwd+bwd")), ("fp8_row", ("fwd",))):
        for shape, scale in (("4096x1024", 1.0), ("65536x8192", 10.0)):
            for pass_ in passes:
                for variant, ms in (("ours", 1.0), ("eager", 2.0), ("compile", 1.5), ("liger", None)):
                    rows.append(
                        {
                            "gpu": "NVIDIA H100 80GB HBM3",
                            "variant": variant,
                            "shape": shape,
                            "dtype": "bf16",
                            "status": "ok" if ms else "skipped",
                            "error": "" if ms else "liger-kernel not importable",
                            "kernel": kernel,
                            "pass": pass_ if ms else "all",
                            "ms": ms * scale if ms else float("nan"),
                            "gbps": 2000.0 / (ms or 1),
                            "copy_gbps": 2900.0,
                            "pct_copy": 2000.0 / (ms or 1) / 29,
                            "host_ms": 0.05,
                            "device_ms": 0.04,
                            "extra_mem_gb": 0.1,
                            "rel_err": 1e-3,
                            "utc": "2026-11-21T20:00:00Z",
                            "run_group": "g1",
                        }
                    )
    return pd.DataFrame(rows)


def test_headline_is_ours_against_the_best_baseline_at_the_largest_size():
    report = phase_module("kernel_suite", "report")
    verdicts = {v.cell: v for v in report.headline(gpu_rows())}
    assert set(verdicts) == {"rms_norm fwd+bwd 65536x8192 bf16", "fp8_row fwd 65536x8192 bf16"}
    for v in verdicts.values():
        assert v.baseline == "compile" and abs(v.ratio - 1.5) < 1e-9 and v.verdict() == "met"


def test_render_names_the_ratio_column_and_plots(tmp_path):
    report = phase_module("kernel_suite", "report")
    text = report.render(gpu_rows(), Figures("kernel_suite", tmp_path, "NVIDIA H100 80GB HBM3"))
    assert (
        "speedup_vs_best" in text and "## Final table" in text and "figures/kernel_suite_rms_norm.png" in text
    )
    assert report.REPORT.title.startswith("kernel_suite — ")
    assert report.headline(pd.DataFrame()) == []


def test_fused_linear_cross_entropy_goal_is_time_against_compile_and_memory_at_once(tmp_path):
    report = phase_module("kernel_suite", "report")
    flce = [("ours", 77.3, 1.71), ("compile", 75.9, 8.41), ("liger", 92.5, 1.32), ("eager", 107.4, 25.2)]
    rows = pd.DataFrame(
        [
            {
                "gpu": "NVIDIA H100 80GB HBM3", "variant": variant, "shape": "16384x128256", "dtype": "bf16",
                "status": "ok", "error": "", "kernel": "fused_linear_cross_entropy", "pass": "fwd+bwd", "ms": ms,
                "gbps": 30.0, "copy_gbps": 2900.0, "pct_copy": 1.0, "host_ms": ms, "device_ms": ms, "extra_mem_gb": gb, "rel_err": 3e-3, "utc": "2026-11-25T15:00:00Z", "run_group": "g2",
            }
            for variant, ms, gb in flce
        ]
    )  # fmt: skip
    (verdict,) = report.headline(rows)
    assert verdict.baseline == "compile" and verdict.verdict() == "met"  # 75.9 / 77.3 = 0.98 >= 1 / 1.05
    text = report.render(rows, Figures("kernel_suite", tmp_path, "NVIDIA H100 80GB HBM3"))
    line = next(line for line in text.splitlines() if line.startswith("- 16384x128256"))
    assert (
        "1.018x compile's" in line and "1.59 GiB beyond the inputs (met)" in line and "Liger 92.50 ms" in line
    )
    slow = rows.assign(extra_mem_gb=rows["extra_mem_gb"].where(rows["variant"] != "ours", 2.5))
    text = report.render(slow, Figures("kernel_suite", tmp_path, "NVIDIA H100 80GB HBM3"))
    assert "2.33 GiB beyond the inputs (missed)" in text


def test_the_options_cost_is_taken_against_the_plain_loss_of_the_same_run(tmp_path):
    report = phase_module("kernel_suite", "report")
    cells = [
        ("cross_entropy", "g3", 3.2),
        ("cross_entropy_options", "g3", 3.3),
        ("cross_entropy_softcap", "g3", 4.0),
    ]
    rows = pd.DataFrame(
        [
            {
                "gpu": "NVIDIA H100 80GB HBM3", "variant": "ours", "shape": "16384x128256", "dtype": "bf16",
                "status": "ok", "error": "", "kernel": kernel, "pass": "fwd+bwd", "ms": ms, "gbps": 2600.0,
                "copy_gbps": 2900.0, "pct_copy": 90.0, "host_ms": ms, "device_ms": ms, "extra_mem_gb": 4.2,
                "rel_err": 3e-3, "utc": "2026-11-25T15:00:00Z", "run_group": group,
            }
            for kernel, group, ms in cells
        ]
    )  # fmt: skip
    figures = Figures("kernel_suite", tmp_path, "NVIDIA H100 80GB HBM3")
    text = report.render(rows, figures)
    all_on = "label_smoothing 0.1, softcap 30, lse_square_scale 0.0001, 16384x128256"
    assert f"{all_on}: 3.300 ms against 3.200 ms plain, 1.031x (met; run g3)" in text
    assert "- softcap 30, 16384x128256: 4.000 ms against 3.200 ms plain, 1.250x (missed; run g3)" in text
    # A newer run of the plain loss alone (with compile beside it, so the verdicts pick it) does not
    # break the pair: the ratio still comes from the run that timed both.
    newer = rows.iloc[[0, 0]].assign(
        variant=["ours", "compile"], ms=[2.0, 3.0], run_group="g5", utc="2026-11-25T16:00:00Z"
    )
    text = report.render(pd.concat([rows, newer], ignore_index=True), figures)
    assert "1.031x (met; run g3)" in text
    host_bound = rows.assign(host_ms=[1.0, 1.2, 1.2], device_ms=[0.27, 0.53, 0.6])
    text = report.render(host_bound, figures)
    assert (
        f"{all_on}: host-bound (calls 3.300 ms against 3.200 ms plain, 1.03x); judged on the kernels: "
        "0.530 against 0.270 ms, 1.963x (missed; run g3)" in text
    )
    quick = rows.assign(host_ms=[1.0, 1.2, 1.2], ms=[1.0, 2.0, 2.0], device_ms=[0.27, 0.28, 0.6])
    assert (
        "2.000 ms against 1.000 ms plain, 2.00x); judged on the kernels: 0.280 against 0.270 ms, 1.037x (met"
        in (report.render(quick, figures))
    )
    apart = rows.assign(run_group=["g3", "g4", "g4"])
    assert "the plain loss was never timed in its run; no ratio" in report.render(apart, figures)


def test_the_target_check_cost_compares_ours_with_and_without_it(tmp_path):
    report = phase_module("kernel_suite", "report")
    cells = [("ours", 1.12), ("ours-unchecked", 0.40), ("compile", 0.73)]
    rows = pd.DataFrame(
        [
            {
                "gpu": "NVIDIA H100 80GB HBM3", "variant": variant, "shape": "4096x32000", "dtype": "bf16",
                "status": "ok", "error": "", "kernel": "cross_entropy", "pass": "fwd+bwd", "ms": ms, "gbps": 500.0,
                "copy_gbps": 2900.0, "pct_copy": 20.0, "host_ms": ms, "device_ms": 0.26, "extra_mem_gb": 0.26,
                "rel_err": 3e-3, "utc": "2026-11-25T15:00:00Z", "run_group": "g5",
            }
            for variant, ms in cells
        ]
    )  # fmt: skip
    text = report.render(rows, Figures("kernel_suite", tmp_path, "NVIDIA H100 80GB HBM3"))
    assert "- cross_entropy 4096x32000: 1.120 ms checked, 0.400 ms unchecked (2.80x)" in text
    assert "ours-unchecked ms" in text
    (verdict,) = report.headline(rows)
    assert verdict.baseline == "compile"  # ours without the check is not a baseline
