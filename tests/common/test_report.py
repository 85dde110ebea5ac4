"""Report rendering from a fixture CSV: latest run per GPU, speedups within a run, plots, index."""

import pandas as pd
import pytest

from common.report import (
    CPU_GPU_LABEL,
    PhaseReport,
    Verdict,
    add_ratio,
    add_speedup,
    best_baseline_verdict,
    format_number,
    load_phase,
    render_phase,
    select_latest,
    select_verdict_runs,
    write_index,
)
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


def test_a_nan_cell_loads_as_missing_and_keeps_the_column_numeric():
    path = data_dir() / "demo"
    path.mkdir(parents=True)
    (path / "run.csv").write_text(FIXTURE.replace(",10.0,", ",nan,"))
    df = load_phase("demo")
    assert pd.api.types.is_float_dtype(df["ms"]) and df["ms"].isna().sum() == 2  # the oom row's too
    assert format_number(df["ms"].iloc[1]) == "5"


def test_latest_run_per_gpu(demo_phase):
    latest = select_latest(demo_phase, ["variant", "shape", "dtype"])
    h100 = latest.loc[latest["gpu"] == "H100"]
    assert set(h100["run_group"]) == {"r2"}
    assert set(latest.loc[latest["gpu"] == "A100", "status"]) == {"oom"}


# r5 ran after r4 but was cut short after our variant: only eager beside it.
CUT_SHORT = (
    FIXTURE
    + """demo,liger,s,bf16,ok,,6.0,H100,2026-03-01T00:00:00Z,r4,r4,1e5
demo,base,s,bf16,ok,,11.0,H100,2026-03-01T00:00:01Z,r4,r4,1e5
demo,eager,s,bf16,ok,,38.0,H100,2026-03-01T00:00:01Z,r4,r4,1e5
demo,fast,s,bf16,ok,,4.5,H100,2026-03-01T00:00:02Z,r4,r4,1e5
demo,fast,s,bf16,ok,,4.2,H100,2026-04-01T00:00:00Z,r5,r5,1e5
demo,eager,s,bf16,ok,,40.0,H100,2026-04-01T00:00:01Z,r5,r5,1e5
demo,liger,s,bf16,timeout,killed,,H100,2026-04-01T00:00:02Z,r5,r5,1e5
"""
)


def three_baseline_verdict(df):
    return best_baseline_verdict(
        "demo",
        df,
        cell="s",
        where={"shape": "s"},
        ours="fast",
        baselines=["base", "liger", "eager"],
        goal=1.0,
    )


def test_a_run_cut_short_does_not_hide_the_complete_run_before_it(tmp_path):
    df = pd.read_csv(pd.io.common.StringIO(CUT_SHORT), dtype={"git_commit": str})
    picked = select_verdict_runs(df, ["shape", "dtype"], ours=["fast"])
    assert set(picked.loc[picked["gpu"] == "H100", "run_group"]) == {"r4"}  # r5 lacks liger, r4's best
    assert set(picked.loc[picked["gpu"] == "A100", "run_group"]) == {"r3"}  # a cell of failures stays
    verdict = three_baseline_verdict(df)
    # r4: liger 6.0 over ours 4.5, never r5's eager 40 over 4.2 (nor a mix of the two runs).
    assert verdict.baseline == "liger" and verdict.ratio == pytest.approx(6.0 / 4.5)


def test_a_rerun_beside_only_the_best_baseline_counts():
    # r6 reruns ours beside liger alone: base and eager lost to liger in r4, so r6 counts.
    rerun = CUT_SHORT + "demo,fast,s,bf16,ok,,4.0,H100,2026-05-01T00:00:00Z,r6,r6,1e5\n"
    rerun += "demo,liger,s,bf16,ok,,6.4,H100,2026-05-01T00:00:01Z,r6,r6,1e5\n"
    df = pd.read_csv(pd.io.common.StringIO(rerun), dtype={"git_commit": str})
    verdict = three_baseline_verdict(df)
    assert verdict.ratio == pytest.approx(6.4 / 4.0)


def test_speedup_only_within_a_run(demo_phase):
    out = add_speedup(demo_phase, ["shape", "dtype"], baseline="base")
    fast = out.loc[(out["variant"] == "fast") & (out["gpu"] == "H100")].set_index("run_group")[
        "speedup_vs_base"
    ]
    assert fast["r1"] == pytest.approx(2.0) and fast["r2"] == pytest.approx(3.0)
    assert out.loc[out["gpu"] == "A100", "speedup_vs_base"].isna().all()  # no baseline in its run


def test_add_ratio_divides_by_the_reference_row_of_the_same_keys():
    df = pd.DataFrame({"shape": ["s", "s", "m", "m", "l"], "mode": ["none", "block", "none", "block", "block"],
                       "ms": ["10", "13", "20", "30", "5"]})  # fmt: skip
    out = add_ratio(df, ["shape"], df["mode"] == "none", "ms", "vs_none")
    assert list(out["vs_none"][:4]) == pytest.approx([1.0, 1.3, 1.0, 1.5])
    assert pd.isna(out["vs_none"][4]) and "_ref" not in out  # no reference: NaN, no helper column left


def demo_headline(df):
    verdict = best_baseline_verdict(
        "demo", df, cell="s", where={"shape": "s"}, ours="fast", baselines=["base"], goal=2.5
    )
    return [verdict] if verdict else []


DEMO = PhaseReport("demo", "demo — a fixture", headline=demo_headline)


def test_render_writes_markdown_with_failures(demo_phase):
    path = render_phase(DEMO)
    text = path.read_text()
    assert "do not edit by hand" in text and "out of memory" in text
    assert "| fast" in text and "r2" in text


def test_number_format():
    assert format_number(1234567.0) == "1,234,567"
    assert format_number(0.012345) == "0.01235"
    assert format_number(float("nan")) == ""
    assert pd.isna(float("nan"))


def test_each_gpu_gets_its_own_section(demo_phase):
    text = render_phase(DEMO).read_text()
    assert "## On the H100" in text and "## On the A100" in text
    # one section per GPU, never two for the same one
    assert text.count("## On the H100") == 1


def test_report_opens_with_the_verdict_of_the_newest_run(demo_phase):
    text = render_phase(DEMO).read_text()
    verdict = text.split("## Verdict", 1)[1].split("##", 1)[0]
    assert "| 3 " in verdict and "met" in verdict  # r2: 12 / 4, against a 2.5x goal


def test_verdict_says_by_how_much_a_goal_was_missed(demo_phase):
    h100 = demo_phase.loc[demo_phase["run_group"] == "r1"]
    (verdict,) = demo_headline(h100)
    assert verdict.ratio == pytest.approx(2.0) and verdict.verdict() == "missed by 20%"


def test_index_opens_with_one_verdict_table(demo_phase, tmp_path):
    text = write_index(tmp_path, [DEMO, PhaseReport("empty", "empty — nothing")]).read_text()
    assert text.index("Where each phase stands") < text.index("Every report")
    assert "| demo " in text and "met" in text and "no data yet" in text


def test_cpu_rows_get_no_times_ratios_or_verdicts(tmp_path):
    path = tmp_path / "data" / "smoke"
    path.mkdir(parents=True)
    (path / "run.csv").write_text(FIXTURE.replace("H100", CPU_GPU_LABEL).replace("A100", CPU_GPU_LABEL))
    text = render_phase(PhaseReport("smoke", "smoke — cpu", headline=demo_headline), tmp_path).read_text()
    assert "measure" in text and "## Verdict" not in text and "met" not in text
    smoke = text.split("CPU smoke runs", 1)[1]
    assert "10.0" not in smoke and "| ms" not in smoke  # no times shown


def test_a_narrow_miss_is_not_rounded_to_zero():
    near = Verdict("p", "cell", "ours", "base", ratio=0.9968, goal=1.0, gpu="g", utc="2026-11-25")
    assert near.verdict() == "missed by 0.3%"


def test_a_newer_failure_of_ours_is_the_verdict_not_the_older_ratio():
    failed = CUT_SHORT + "demo,fast,s,bf16,error,O out of bounds,,H100,2026-05-01T00:00:00Z,r6,r6,1e5\n"
    df = pd.read_csv(pd.io.common.StringIO(failed), dtype={"git_commit": str})
    verdict = three_baseline_verdict(df)
    assert verdict.verdict() == "failed: O out of bounds" and pd.isna(verdict.ratio)
    assert verdict.as_row()["date"] == "2026-05-01"
    # An older failure does not hide a newer success.
    recovered = failed + "demo,fast,s,bf16,ok,,4.1,H100,2026-06-01T00:00:00Z,r7,r7,1e5\n"
    recovered += "demo,liger,s,bf16,ok,,6.2,H100,2026-06-01T00:00:01Z,r7,r7,1e5\n"
    df = pd.read_csv(pd.io.common.StringIO(recovered), dtype={"git_commit": str})
    assert three_baseline_verdict(df).ratio == pytest.approx(6.2 / 4.1)
