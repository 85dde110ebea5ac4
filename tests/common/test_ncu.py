"""Nsight Compute rows: the raw CSV read back, kernels credited to their calls, the report table and its
comparison with a baseline, the ncu passes' command line."""

import csv
import io

import pandas as pd
import pytest

import common.ncu as ncu
from common import ResultWriter
from common.ncu import SUBDIR, compare_calls, parse_raw, render_profile, top_stall

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
    "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
]
UNITS = ["", "", "", "", "", "us", "%", "", "", "", ""]


def raw_csv(*rows) -> str:
    out = io.StringIO()
    csv.writer(out, quoting=csv.QUOTE_ALL).writerows([HEADER, UNITS, *rows])
    return out.getvalue()


def test_kernels_are_credited_to_the_latest_nvtx_range_and_times_become_ms():
    text = raw_csv(
        ["0", '596  "<default domain>:sdpa-cudnn:none:none:none:none:none:none" ', "fprop", "132", "384",
         "2,075.136", "45.3", "0.50", "0.81", "0.46", "1.00"],
        ["1", "", "bprop", "132", "384", "5,105.3", "47.1", "0.84", "0.71", "1.24", "1.00"],
        ["2", '596  "<default domain>:triton-fused:none:none:none:none:none:none" ', "_attn_fwd_kernel",
         "2,752", "128", "2,003.9", "47.5", "1.06", "1.27", "", "1.00"],
    )  # fmt: skip
    rows = parse_raw(text, top_stalls=2)
    assert [r["variant"] for r in rows] == ["sdpa-cudnn", "sdpa-cudnn", "triton-fused"]
    assert abs(rows[0]["time_ms"] - 2.075136) < 1e-9 and abs(rows[1]["time_ms"] - 5.1053) < 1e-9
    assert rows[2]["tensor_pct"] == 47.5 and rows[2]["grid"] == "2,752"
    assert rows[1]["stalls"] == "long_scoreboard 1.24, barrier 0.84"  # "selected", 1.00, is not a stall
    assert rows[2]["stalls"] == "wait 1.27, barrier 1.06"  # an empty counter reads as zero
    assert "xu_pct" not in rows[0]  # a metric the report lacks is left out, not invented


def test_the_report_table_shows_the_newest_profile_of_that_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITONLAB_DATA_DIR", str(tmp_path))
    none = render_profile("04_fused_attn", "any GPU")
    assert "Where the time goes" in none and "_Not profiled yet: `phases/04_fused_attn/ncu_pass.py`" in none
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
    assert render_profile("04_fused_attn", "another GPU") == ""  # that GPU's section shows the profile


def test_pass_shape_reads_the_shape_and_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(ncu, "ON_GPU", False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        ncu.pass_shape("prog", ["--shape", "small"])
    with pytest.raises(SystemExit) as exit_:  # the command line is read first: its errors are argparse's
        ncu.pass_shape("prog", ["--shape", "huge"])
    assert exit_.value.code == 2 and "invalid choice: 'huge'" in capsys.readouterr().err
    monkeypatch.setattr(ncu, "ON_GPU", True)
    assert ncu.pass_shape("prog", []).name == "mid"
    assert ncu.pass_shape("prog", ["--shape", "large"]).name == "large"
    three = {"type": int, "nargs": 3, "default": (16, 16384, 64)}
    assert ncu.parse_pass_shape("prog", [], **three) == (16, 16384, 64)
    assert ncu.parse_pass_shape("prog", ["--shape", "1", "128", "64"], **three) == [1, 128, 64]


def test_top_stall_skips_selected_and_reads_the_cycles():
    assert top_stall("selected 1.00, wait 0.81, barrier 0.50") == ("wait", 0.81)
    assert top_stall("long_scoreboard 44.38") == ("long_scoreboard", 44.38)
    assert top_stall(float("nan")) is None and top_stall("selected 1.00") is None


def test_compare_calls_weights_by_kernel_time_and_leaves_out_what_is_missing():
    rows = pd.DataFrame(
        [{"variant": "base", "kernel": "main", "time_ms": 3.0, "tensor_pct": 60.0, "stalls": "wait 1.00"},
         {"variant": "base", "kernel": "tail", "time_ms": 1.0, "tensor_pct": 20.0, "stalls": "drain 9.00"},
         {"variant": "ours", "kernel": "k", "time_ms": 2.0, "tensor_pct": 45.0, "stalls": "barrier 2.00"}]
    )  # fmt: skip
    text = compare_calls(rows, "base")
    assert text.startswith("`ours` runs 2.00 ms in 1 kernel against `base`'s 4.00 ms in 2 (0.50× its time)")
    assert "tensor pipe is busy 45% of active cycles against 50%;" in text  # (60·3 + 20·1) / 4
    assert "scheduler" not in text and "warp slots" not in text  # issue_pct, occupancy_pct: not collected
    assert (
        "stalls most on `barrier` (2.00 cycles per issued instruction), `base`'s (`main`, 3.00 ms) on `wait`"
        in text
    )
    assert compare_calls(rows, "absent") == ""
    assert compare_calls(rows.assign(stalls=None), "base").endswith("against 50%.")
