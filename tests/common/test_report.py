"""Report rendering from a fixture CSV: latest run per GPU, speedups within a run, plots, index."""

import pandas as pd
import pytest

from common.report import add_speedup, format_number, load_phase, render_phase, select_latest
from common.results import data_dir

FIXTURE = """phase,variant,shape,dtype,status,error,ms,gpu,utc,run_group,run_id,git_commit
demo,base,s,bf16,ok,,10.0,H100,2026-01-01T00:00:00Z,r1,r1,0123456789ab
demo,fast,s,bf16,ok,,5.0,H100,2026-01-01T00:00:01Z,r1,r1,0123456789ab
demo,base,s,bf16,ok,,12.0,H100,2026-02-01T00:00:00Z,r2,r2,1e5
demo,fast,s,bf16,ok,,4.0,H100,2026-02-01T00:00:01Z,r2,r2,1e5
demo,fast,s,bf16,oom,CUDA out of memory,,A100,2026-02-01T00:00:01Z,r3,r3,1e5
"""


@pytest.fixture
def demo_phase():
    path = data_dir() / "demo"
    path.mkdir(parents=True)
    (path / "run.csv").write_text(FIXTURE)
    return load_phase("demo")


def test_load_keeps_provenance_as_text(demo_phase):
    assert demo_phase["git_commit"].tolist()[2] == "1e5"  # not the number 100000


def test_latest_run_per_gpu(demo_phase):
    latest = select_latest(demo_phase, ["variant", "shape", "dtype"])
    h100 = latest.loc[latest["gpu"] == "H100"]
    assert set(h100["run_group"]) == {"r2"}
    assert set(latest.loc[latest["gpu"] == "A100", "status"]) == {"oom"}


def test_speedup_only_within_a_run(demo_phase):
    out = add_speedup(demo_phase, ["shape", "dtype"], baseline="base")
    fast = out.loc[(out["variant"] == "fast") & (out["gpu"] == "H100")].set_index("run_group")[
        "speedup_vs_base"
    ]
    assert fast["r1"] == pytest.approx(2.0) and fast["r2"] == pytest.approx(3.0)
    assert out.loc[out["gpu"] == "A100", "speedup_vs_base"].isna().all()  # no baseline in its run


def test_render_writes_markdown_with_failures(demo_phase):
    path = render_phase("demo")
    text = path.read_text()
    assert "do not edit by hand" in text and "out of memory" in text
    assert "| fast" in text and "r2" in text


def test_number_format():
    assert format_number(1234567.0) == "1,234,567"
    assert format_number(0.012345) == "0.01235"
    assert format_number(float("nan")) == ""
    assert pd.isna(float("nan"))


def test_each_gpu_gets_its_own_section(demo_phase):
    text = render_phase("demo").read_text()
    assert "## On the H100" in text and "## On the A100" in text
    # one section per GPU, never two for the same one
    assert text.count("## On the H100") == 1
