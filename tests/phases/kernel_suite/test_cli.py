"""Phase kernel_suite's command line and CPU run: argparse errors list the choices, tiny sizes run in
the interpreter and write rows with the committed columns, the tuning sweep runs."""

import csv

import pytest

from common import ON_GPU, ResultWriter, run_cells
from phases.__main__ import phase_module, run_phase

pytestmark = pytest.mark.skipif(ON_GPU, reason="the CPU's defaults and refusals")

# The columns of the committed rows (reports/data/kernel_suite/*.csv) that the report reads.
COMMITTED = {"variant", "shape", "dtype", "status", "error", "kernel", "tokens", "width", "pass", "ms",
             "p20_ms", "p80_ms", "reps", "bytes", "gbps", "copy_gbps", "pct_copy", "rel_err",
             "extra_mem_gb", "inputs_gb", "host_ms", "device_ms"}  # fmt: skip


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--kernels", "layer_norm"], "invalid choice"),
        (["--variants", "triton"], "invalid choice"),
        (["--passes", "backward"], "invalid choice"),
        (["--dtype", "fp8"], "invalid choice"),
        (["--shape", "huge"], "invalid choice"),
        (["--shape", "full"], "interpreter"),
        (["--shape", "quick"], "interpreter"),
    ],
)
def test_bad_values_are_argparse_errors(argv, message, capsys):
    main = phase_module("kernel_suite", "__main__")
    with pytest.raises(SystemExit) as err:
        main.parse_args(argv)
    assert err.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults_on_the_cpu():
    args = phase_module("kernel_suite", "__main__").parse_args([])
    assert args.shape == ["tiny"] and args.variants == ["ours", "eager"] and args.dtype == "bf16"


def test_tiny_run_writes_a_row_per_cell(tmp_path):
    run_phase("kernel_suite", ["--kernels", "rms_norm", "cross_entropy", "fp8_block", "--dtype", "fp32",
                               "--out", str(tmp_path), "--no-report"])  # fmt: skip
    (path,) = (tmp_path / "data" / "kernel_suite").glob("*.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert set(rows[0]) >= COMMITTED
    cells = {(r["kernel"], r["variant"], r["pass"]) for r in rows}
    # rms_norm: three passes; cross-entropy forward+backward only; quantisation forward only
    assert len(rows) == len(cells) == 2 * (3 + 1 + 1)
    assert ("cross_entropy", "ours", "fwd+bwd") in cells and ("fp8_block", "eager", "fwd") in cells
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    assert all(float(r["rel_err"]) < 0.05 for r in rows)  # FP8: e4m3 rounding, ~2.6% rms


def test_cell_count_matches_the_cells():
    bench = phase_module("kernel_suite", "bench")
    args = (["gelu", "rope", "fp8_row"], ["ours", "eager", "liger"], ["fwd", "fwd+bwd"], ["tiny"])
    cells = list(bench.cells(*args, "fp32", {}))
    assert bench.count_cells(*args) == len(cells)
    liger = [c for c in cells if c.variant == "liger"]
    if bench.LIGER_MISSING:  # one row per op saying why, not a crash
        assert len(liger) == 3 and all(c.run()["status"] == "skipped" for c in liger)


def test_a_wrong_result_is_a_failure_row_and_the_sweep_goes_on(monkeypatch):
    bench = phase_module("kernel_suite", "bench")
    monkeypatch.setitem(bench.TOLERANCE, "gelu", -1.0)  # nothing passes
    writer = ResultWriter("kernel_suite")
    rows = run_cells(writer, bench.cells(["gelu", "fp8_row"], ["ours"], ["fwd"], ["tiny"], "fp32", {}))
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert "exceeds" in rows[0]["error"]


def test_tune_sweeps_run_and_are_checked(monkeypatch):
    bench = phase_module("kernel_suite", "bench")
    # Two settings of each list: every kernel's sweep runs and is checked (the interpreter is slow).
    monkeypatch.setattr(bench, "CE_SETTINGS", bench.CE_SETTINGS[:2])
    monkeypatch.setattr(bench, "RMS_SETTINGS", bench.RMS_SETTINGS[:2])
    monkeypatch.setattr(bench, "CE_SHORT_SETTINGS", bench.CE_SHORT_SETTINGS[:2])
    writer = ResultWriter("kernel_suite", subdir="tune")
    rows = run_cells(writer, bench.tune_cells("fp32", {"warmup_ms": 1.0, "rep_ms": 1.0, "min_reps": 1}))
    # cross-entropy five times (the plain loss; the options kernel all on, smoothing, softcap, z-loss:
    # the two with the softcap with the fixed and the running max), each also at the short rows'
    # size once per short-row setting; RMSNorm's backward once
    short = 5 * len(bench.CE_SHORT_SETTINGS)
    assert len(rows) == 7 * len(bench.CE_SETTINGS) + short + len(bench.RMS_SETTINGS)
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    kernels = [r["kernel"] for r in rows]
    for kernel, runs in (
        ("cross_entropy", 1),
        ("cross_entropy_options", 2),
        ("cross_entropy_smoothing", 1),
        ("cross_entropy_softcap", 2),
        ("cross_entropy_zloss", 1),
    ):
        assert kernels.count(kernel) == runs * len(bench.CE_SETTINGS) + len(bench.CE_SHORT_SETTINGS)
    short_rows, short_vocab = bench.TUNE_SIZES_CPU["cross_entropy_short"]
    assert sum(r["shape"] == f"{short_rows}x{short_vocab}" for r in rows) == short
    assert any("max_registers=64" in r["setting"] for r in rows)
    softcapped = [r["setting"] for r in rows if r["kernel"] == "cross_entropy_softcap"]
    assert sum("fixed_max=False" in s for s in softcapped) == len(bench.CE_SETTINGS)
    assert writer.path.parent.name == "tune"  # kept out of the benchmark's tables


def test_interleaved_kernel_times_its_variants_together_in_rounds(monkeypatch):
    """The fused linear cross-entropy's variants are checked first, then timed once, together, in
    alternating rounds; each row says how many."""
    bench = phase_module("kernel_suite", "bench")
    timed_together = []

    def spy(fns, **kw):
        timed_together.append(list(fns))
        return real(fns, **kw)

    real = bench.bench_interleaved
    monkeypatch.setattr(bench, "bench_interleaved", spy)
    kernel = "fused_linear_cross_entropy"
    cells = bench.cells(
        [kernel], ["ours", "eager"], ["fwd+bwd"], ["tiny"], "fp32", {"warmup_ms": 1, "rep_ms": 1}
    )
    rows = run_cells(ResultWriter("kernel_suite"), cells)
    assert timed_together == [["ours", "eager"]]
    assert [(r["variant"], r["status"], r["rounds"]) for r in rows] == [
        ("ours", "ok", bench.INTERLEAVED[kernel]),
        ("eager", "ok", bench.INTERLEAVED[kernel]),
    ]
    assert all(r["reps"] >= 3 * bench.INTERLEAVED[kernel] for r in rows)
