"""Nsight Compute rows: the raw CSV read back, kernels credited to their calls, the report table."""

import csv
import io

import pytest

import common.ncu as ncu
from common import ResultWriter
from common.ncu import SUBDIR, parse_raw, render_profile

NVTX = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
HEADER = [
    "ID",
    NVTX,
    "Kernel Name",
    "Grid Size",
    "Block Size",
    "gpu__time_duration.sum",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
]
UNITS = ["", "", "", "", "", "us", "%", "", "", ""]


def raw_csv(*rows) -> str:
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL).writerows([HEADER, UNITS, *rows])
    return out.getvalue()


def test_kernels_are_credited_to_the_latest_nvtx_range_and_times_become_ms():
    text = raw_csv(
        ["0", '596  "<default domain>:sdpa-cudnn:none:none:none:none:none:none" ', "fprop", "132", "384",
         "2,075.136", "45.3", "0.50", "0.81", "0.46"],
        ["1", "", "bprop", "132", "384", "5,105.3", "47.1", "0.84", "0.71", "1.24"],
        ["2", '596  "<default domain>:triton-fused:none:none:none:none:none:none" ', "_attn_fwd_kernel",
         "2,752", "128", "2,003.9", "47.5", "1.06", "1.27", ""],
    )  # fmt: skip
    rows = parse_raw(text, top_stalls=2)
    assert [r["variant"] for r in rows] == ["sdpa-cudnn", "sdpa-cudnn", "triton-fused"]
    assert abs(rows[0]["time_ms"] - 2.075136) < 1e-9 and abs(rows[1]["time_ms"] - 5.1053) < 1e-9
    assert rows[2]["tensor_pct"] == 47.5 and rows[2]["grid"] == "2,752"
    assert rows[1]["stalls"] == "long_scoreboard 1.24, barrier 0.84"
    assert rows[2]["stalls"] == "wait 1.27, barrier 1.06"  # an empty counter reads as zero
    assert "xu_pct" not in rows[0]  # a metric the report lacks is left out, not invented


def test_the_report_table_shows_the_newest_profile_of_that_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONLAB_DATA_DIR", str(tmp_path))
    assert render_profile("04_fused_attn", "any GPU") == ""
    for time_ms in (9.0, 7.0):  # two runs: only the second is shown
        writer = ResultWriter("04_fused_attn", subdir=SUBDIR)
        writer.write(
            {"variant": "triton-fused", "kernel": "k", "time_ms": time_ms, "shape": "mid", "dtype": "bf16"}
        )
    assert writer.path.parent == tmp_path / "04_fused_attn" / SUBDIR
    gpu = writer.rows[0]["gpu"]
    table = render_profile("04_fused_attn", gpu)
    assert "Where the time goes" in table and "| 7 " in table and "| 9 " not in table
    assert f"commit {writer.rows[0]['git_commit']}," in table  # read as text, never as a number
    assert render_profile("04_fused_attn", "another GPU") == ""


def test_pass_shape_reads_the_shape_and_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(ncu, "ON_GPU", False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        ncu.pass_shape("prog", ["--shape", "small"])
    monkeypatch.setattr(ncu, "ON_GPU", True)
    assert ncu.pass_shape("prog", []).name == "mid"
    assert ncu.pass_shape("prog", ["--shape", "large"]).name == "large"
