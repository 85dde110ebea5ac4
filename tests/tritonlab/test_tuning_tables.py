"""The config tables: lookup order, bucket reuse, the TRITONLAB_AUTOTUNE knob, the file format and
what happens with a missing, corrupt or stale table. A two-config toy kernel in the interpreter, with
a fake timer that counts how often the autotuner times a candidate."""

import json
import logging

import pytest
import torch
import triton
import triton.language as tl

from tritonlab import tuning_tables as tt
from tritonlab import tuning_workloads
from tritonlab._launch import LaunchCache
from tritonlab.testing import run_without_interpreter

H100 = "NVIDIA H100 80GB HBM3"


@triton.jit
def _scale_kernel(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < N) * 2.0, mask=offs < N)


CONFIGS = [triton.Config({"BLOCK": 64}, num_warps=4), triton.Config({"BLOCK": 32}, num_warps=2)]


class Toy:
    """A registered toy kernel on its own Tuner, the device named ``device``, tables in ``tmp``."""

    def __init__(self, tmp, device=H100):
        self.timed = []
        self.tuner = tt.Tuner(table_dir=tmp, device_name=lambda t: device)

        def bench(call, quantiles):
            self.timed.append(call)
            call()
            return [1.0 + len(self.timed) % 2, 0.0, 0.0]  # the second candidate (BLOCK=32) wins

        self.kernel = tt.autotune(
            CONFIGS, name="toy.scale", phase="11_autotune", key=["N"], dtype_arg="X",
            buckets={"N": tt.pow2_bucket}, tuner=self.tuner, do_bench=bench,
        )(_scale_kernel)  # fmt: skip

    def __call__(self, n: int) -> torch.Tensor:
        x = torch.arange(n, dtype=torch.float32)
        y = torch.empty_like(x)
        self.kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
        torch.testing.assert_close(y, 2 * x)
        return self.kernel.best_config


def _key(n: int) -> str:
    return f"N={tt.pow2_bucket(n)}|fp32,fp32"


def _write_table(tmp, entries, gpu="h100", dtype="fp32"):
    table = tt.ConfigTable(gpu, dtype, meta={"device_name": H100})
    for key, config in entries.items():
        table.put("toy.scale", key, {"config": tt.config_to_json(config), "status": tt.TIMED, "ms": 1.0})
    return table.save(tt.table_path(gpu, dtype, tmp))


def test_hit_launches_the_table_config_without_timing(tmp_path, monkeypatch):
    monkeypatch.delenv(tt.ENV_VAR, raising=False)
    _write_table(tmp_path, {_key(100): CONFIGS[0]})
    toy = Toy(tmp_path)
    assert toy(100).kwargs == {"BLOCK": 64}
    assert toy.timed == []
    assert toy.tuner.tunings == []


def test_miss_tunes_once_per_bucket_and_says_so_once(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(tt.ENV_VAR, raising=False)
    _write_table(tmp_path, {_key(5000): CONFIGS[0]})  # a table, without this bucket
    toy = Toy(tmp_path)
    with caplog.at_level(logging.INFO, logger="tritonlab"):
        assert toy(100).kwargs == {"BLOCK": 32}
        assert len(toy.timed) == 2
        # New lengths (new autotuner keys) in the same bucket: the bucket's pick, no timing.
        for n in (65, 127, 128):
            assert toy(n).kwargs == {"BLOCK": 32}
        assert len(toy.timed) == 2
        toy(300)  # a new bucket tunes again
    assert len(toy.timed) == 4
    misses = [r for r in caplog.records if "no entry" in r.getMessage()]
    assert len(misses) == 1 and "toy.scale" in misses[0].getMessage()
    (tuning,) = [t for t in toy.tuner.tunings if t.key == _key(100)]
    assert (tuning.gpu, tuning.dtype) == ("h100", "fp32")
    assert sorted(tuning.timings.values()) == [1.0, 2.0]


def test_a_lone_candidate_after_pruning_launches_untimed(tmp_path, monkeypatch):
    """Nothing to compare: the one config the pruner leaves is the pick, with no timing and no tuning
    recorded (in the interpreter, timing would need a GPU)."""
    monkeypatch.delenv(tt.ENV_VAR, raising=False)
    timed = []
    tuner = tt.Tuner(table_dir=tmp_path, device_name=lambda t: H100)
    kernel = tt.autotune(
        CONFIGS, name="toy.pruned", phase="11_autotune", key=["N"], dtype_arg="X", tuner=tuner,
        do_bench=lambda call, quantiles: timed.append(call) or [1.0, 0.0, 0.0],
        prune_configs_by={"early_config_prune": lambda configs, named_args, **kwargs: configs[1:]},
    )(_scale_kernel)  # fmt: skip
    x = torch.arange(100, dtype=torch.float32)
    y = torch.empty_like(x)
    kernel[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, y, 100)
    torch.testing.assert_close(y, 2 * x)
    assert kernel.best_config.kwargs == {"BLOCK": 32}
    assert timed == [] and tuner.tunings == []


def test_unknown_gpu_tunes_with_one_clear_log_line(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(tt.ENV_VAR, raising=False)
    _write_table(tmp_path, {_key(100): CONFIGS[0]})
    (tmp_path / "sm80_compile.json").write_text("{}")  # not a table
    toy = Toy(tmp_path, device="NVIDIA GeForce RTX 9090")
    with caplog.at_level(logging.WARNING, logger="tritonlab"):
        assert toy(100).kwargs == {"BLOCK": 32}
        toy(300)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "no tuned-config table for nvidia_geforce_rtx_9090/fp32" in lines[0]
    assert lines[0].endswith("Tables: h100_fp32")  # the tables there are


@pytest.mark.parametrize(
    "text, reason",
    [
        ("{not json", "not a readable JSON table"),
        (json.dumps({"schema": 99, "gpu": "h100", "dtype": "fp32", "entries": {}}), "schema 99"),
        (json.dumps({"schema": 1, "gpu": "h100", "dtype": "fp32"}), "missing field 'entries'"),
        (
            json.dumps(
                {
                    "schema": 1,
                    "gpu": "h100",
                    "dtype": "fp32",
                    "entries": {"toy.scale": {"k": {"status": "timed"}}},
                }
            ),
            "'config' needs",
        ),
    ],
)
def test_corrupt_table_is_an_error_naming_the_file_and_ignored_at_launch(
    tmp_path, monkeypatch, caplog, text, reason
):
    monkeypatch.delenv(tt.ENV_VAR, raising=False)
    path = tt.table_path("h100", "fp32", tmp_path)
    path.write_text(text)
    with pytest.raises(tt.TableError, match=reason) as info:
        tt.ConfigTable.load(path)
    assert str(path) in str(info.value)
    toy = Toy(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tritonlab"):
        assert toy(100).kwargs == {"BLOCK": 32}  # tuned, as without a table
    assert any(str(path) in r.getMessage() and "ignoring" in r.getMessage() for r in caplog.records)


def test_stale_entry_is_ignored_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(tt.ENV_VAR, raising=False)
    path = _write_table(tmp_path, {_key(100): triton.Config({"BLOCK": 128}, num_warps=8)})
    toy = Toy(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tritonlab"):
        assert toy(100).kwargs == {"BLOCK": 32}
    assert len(toy.timed) == 2
    assert any("stale" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records)


def test_modes(tmp_path, monkeypatch):
    _write_table(tmp_path, {_key(100): CONFIGS[0]})
    monkeypatch.setenv(tt.ENV_VAR, "off")
    toy = Toy(tmp_path)
    assert toy(100) is CONFIGS[0] and toy.timed == []  # the first config the prune keeps
    monkeypatch.setenv(tt.ENV_VAR, "full")
    toy = Toy(tmp_path)
    assert toy(100).kwargs == {"BLOCK": 32} and len(toy.timed) == 2  # the table is ignored
    monkeypatch.setenv(tt.ENV_VAR, "FULL ")
    assert tt.autotune_mode() == "full"
    monkeypatch.setenv(tt.ENV_VAR, "fast")
    with pytest.raises(
        ValueError, match="TRITONLAB_AUTOTUNE: unknown value 'fast'; expected one of off, table, full"
    ):
        Toy(tmp_path)(100)


def test_full_mode_times_afresh_even_with_tritons_disk_cache_on(tmp_path, monkeypatch):
    # TRITON_CACHE_AUTOTUNING=1 would hand back earlier timings as if measured now: not under "full".
    from triton.runtime.autotuner import Autotuner

    disk_reads = []

    def cached(self, key, configs, bench_fn):
        disk_reads.append(key)
        bench_fn()
        return False

    monkeypatch.setattr(Autotuner, "check_disk_cache", cached)
    for mode, reads in (("full", 0), ("table", 1)):
        disk_reads.clear()
        monkeypatch.setenv(tt.ENV_VAR, mode)
        toy = Toy(tmp_path)  # no table here: "table" tunes as without one
        toy.kernel.cache_results = True  # as the environment variable sets it on a GPU
        assert toy(100).kwargs == {"BLOCK": 32} and len(toy.timed) == 2
        assert len(disk_reads) == reads and toy.kernel.cache_results


def test_table_round_trip_and_entry_checks(tmp_path):
    path = _write_table(tmp_path, {_key(100): CONFIGS[1]})
    table = tt.ConfigTable.load(path)
    assert (table.gpu, table.dtype, table.meta) == ("h100", "fp32", {"device_name": H100})
    entry = table.entry("toy.scale", _key(100))
    assert tt.config_id(entry["config"]) == tt.config_id(CONFIGS[1])
    assert table.entry("toy.scale", _key(1000)) is None
    with pytest.raises(ValueError, match="'status' must be one of"):
        table.put("toy.scale", "k", {"config": tt.config_to_json(CONFIGS[0]), "status": "guessed"})


def test_names_of_gpus_and_dtypes():
    assert tt.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert tt.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert tt.gpu_slug("NVIDIA H200") == "h200"
    assert tt.dtype_name(torch.bfloat16) == "bf16" and tt.dtype_name(torch.float8_e4m3fn) == "fp8"
    assert [tt.pow2_bucket(n) for n in (1, 37, 64, 65, 11_000)] == [1, 64, 64, 128, 16_384]


def test_a_name_registers_once(tmp_path):
    toy = Toy(tmp_path)
    with pytest.raises(ValueError, match="registered already"):
        tt.autotune(CONFIGS, name="toy.scale", phase="x", key=["N"], dtype_arg="X", tuner=toy.tuner)(
            _scale_kernel
        )
    with pytest.raises(ValueError, match="not arguments of the kernel"):
        tt.autotune(CONFIGS, name="toy.other", phase="x", key=["M"], dtype_arg="X", tuner=toy.tuner)(
            _scale_kernel
        )


def test_every_library_kernel_is_registered():
    tuning_workloads.import_kernels()

    names = set(tt.TUNER.kernels)
    expected = {
        "attention.forward", "attention.dkdv", "attention.dq", "attention.fused_backward", "attention.fp8_forward",
        "mlp.staged_forward", "mlp.register_forward", "mlp.gemm_silu", "heads.forward", "heads.hidden_backward",
        "sparse_ffn.fixed_slice_matmul", "sparse_ffn.fixed_slice_matmul_tma",
    }  # fmt: skip
    assert expected <= names
    for kernel in tt.TUNER.kernels.values():
        assert kernel.spec.phase and set(kernel.spec.key) <= set(kernel.arg_names)


def test_lookup_serves_kernels_whose_settings_are_a_table_in_code(tmp_path, monkeypatch):
    monkeypatch.delenv(tt.ENV_VAR, raising=False)
    _write_table(tmp_path, {_key(100): CONFIGS[1]})
    tuner = tt.Tuner(table_dir=tmp_path)
    assert tuner.lookup("toy.scale", _key(100), "h100", "fp32") == tt.config_to_json(CONFIGS[1])
    assert tuner.lookup("toy.scale", _key(1000), "h100", "fp32") is None
    assert tuner.lookup("toy.scale", _key(100), "a100", "fp32") is None
    for mode in ("off", "full"):  # the code's own settings
        monkeypatch.setenv(tt.ENV_VAR, mode)
        assert tuner.lookup("toy.scale", _key(100), "h100", "fp32") is None


def test_flash2_keys_and_tiles_from_an_entry():
    from tritonlab.attention import flash2

    assert flash2.table_key(torch.bfloat16, 64, True) == "CAUSAL=True,HEAD_DIM=64|bf16"
    assert flash2.table_name("dkdv") == "flash2.dkdv"
    entry = tt.config_to_json(triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=8, num_stages=2))
    assert flash2.tiles_from_entry(entry) == flash2.TileConfig(64, 32, 8, 2)
    assert flash2.tiles_from_entry({**entry, "kwargs": {"BLOCK_M": 64}}) is None


def test_forget_drops_picks_and_direct_launches(tmp_path, monkeypatch):
    monkeypatch.delenv(tt.ENV_VAR, raising=False)
    toy = Toy(tmp_path)
    cache = LaunchCache(lambda tensors: ("compiled", (1, 1, 1), (), "config"), tuner=toy.tuner)
    assert cache.launch("signature", ()) == "config"  # a first launch: tuned and kept
    toy(100)
    assert toy.tuner.picks and cache._launches
    toy.tuner.forget()
    assert not toy.tuner.picks and not cache._launches and not toy.kernel.cache
    toy(100)
    assert len(toy.timed) == 4  # tuned again


# --- on a GPU: a launch from the table computes what the autotuned launch computed ---------------


@pytest.mark.gpu
def test_flash2_takes_its_tiles_from_the_table_on_gpu(tmp_path, monkeypatch):
    from tritonlab.attention import flash2

    monkeypatch.delenv(tt.ENV_VAR, raising=False)
    gpu = tt.gpu_slug(torch.cuda.get_device_name())
    tiles = flash2.TileConfig(64, 32, 4, 2)
    table = tt.ConfigTable(gpu, "bf16")
    config = triton.Config({"BLOCK_M": tiles.block_m, "BLOCK_N": tiles.block_n}, num_warps=4, num_stages=2)
    table.put(
        "flash2.fwd",
        flash2.table_key(torch.bfloat16, 64, True),
        {"config": tt.config_to_json(config), "status": tt.TIMED},
    )
    table.save(tt.table_path(gpu, "bf16", tmp_path))
    tt.TUNER.forget()
    monkeypatch.setattr(tt.TUNER, "table_dir", tmp_path)
    device = torch.device("cuda")
    assert flash2.tile_config("fwd", torch.bfloat16, 64, True, device) == tiles
    assert flash2.tile_config("fwd", torch.bfloat16, 64, True) == flash2._table_config(
        "fwd", torch.bfloat16, 64, True
    )
    q, k, v = (torch.randn(2, 300, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    from_table = flash2.flash_forward(q, k, v, True)
    forced = flash2.flash_forward(q, k, v, True, config=tiles)
    assert all(torch.equal(a, b) for a, b in zip(from_table, forced, strict=True))
    tt.TUNER.forget()


@pytest.mark.gpu
@pytest.mark.parametrize("function", list(tuning_workloads.FUNCTIONS))
def test_a_table_launch_matches_the_autotuned_path_on_gpu(function, tmp_path, monkeypatch):
    tuner = tt.TUNER
    (workload,) = tuning_workloads.workloads(["small"], functions=[function])
    monkeypatch.setenv(tt.ENV_VAR, "full")
    tuner.forget()
    torch.manual_seed(0)
    run = workload.runner("cuda")
    tuned = [t.clone() for t in run()]
    assert {t.kernel for t in tuner.tunings} == set(workload.kernels)
    tables: dict = {}
    for t in tuner.tunings:
        table = tables.setdefault((t.gpu, t.dtype), tt.ConfigTable(t.gpu, t.dtype))
        table.put(t.kernel, t.key, {"config": tt.config_to_json(t.pick), "status": tt.TIMED})
    for table in tables.values():
        table.save(tt.table_path(table.gpu, table.dtype, tmp_path))

    tuner.forget()
    monkeypatch.setattr(tuner, "table_dir", tmp_path)
    monkeypatch.setenv(tt.ENV_VAR, "table")
    again = run()
    assert tuner.tunings == []  # every config came from the table: nothing was timed
    for before, after in zip(tuned, again, strict=True):
        assert torch.equal(before, after)
    tuner.forget()


def test_every_committed_entry_names_a_config_of_its_kernels_search_space():
    # A search space edited without re-tuning would make its entries stale: ignored at launch with a
    # warning, so the kernel tunes at a user's first call. The GPU's search spaces are built only
    # outside the interpreter: a fresh process without TRITON_INTERPRET (no GPU needed to build them).
    code = "import json; from tritonlab.tuning_workloads import stale_entries; print(json.dumps(stale_entries()))"
    out = run_without_interpreter(code)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    assert {p.stem for p in tt.TABLE_DIR.glob("*.json")} >= {"h100_bf16", "h100_fp8", "a100_bf16"}


def test_a_stale_entry_is_found(tmp_path):
    _write_table(tmp_path, {_key(100): triton.Config({"BLOCK": 48}, num_warps=4)}, dtype="bf16")
    (tmp_path / "h100_bf16.json").write_text(
        (tmp_path / "h100_bf16.json").read_text().replace("toy.scale", "attention.forward")
    )
    assert tuning_workloads.stale_entries(tmp_path) == [("h100_bf16.json", "attention.forward", _key(100))]
