"""Every attention config space, pruned by element size and the GPU's shared memory: with an
H100's limit (232 448 B per block), a float32 call at D = 128 never asks for more than fits, and
16-bit calls keep the tiles they are tuned over."""

import pytest
import torch
import triton

from tritonlab.attention import _common, backward, forward, fused
from tritonlab.attention.flash2 import TileConfig, _fit, _fits, _table_config
from tritonlab.tuning import HOPPER_SHARED_MEMORY


@pytest.fixture
def h100(monkeypatch):
    """Pretend the kernels run on an H100 (the interpreter has no limit)."""
    monkeypatch.setattr(
        _common, "fits_shared_memory", lambda need, headroom=1.0: need * headroom <= HOPPER_SHARED_MEMORY
    )


class _Args(dict):
    """The autotuner's named_args: a Q tensor for its element size, Lq and Lk."""

    def __init__(self, dtype, lk=10_000, choice=2, lq=10_000):
        super().__init__(Q=torch.empty(1, dtype=dtype), Lq=lq, Lk=lk, IMPL_CHOICE=choice)


def _tiles(configs, *names):
    return {tuple(c.kwargs[n] for n in names) + (c.num_stages,) for c in configs}


@pytest.mark.parametrize("head_dim", [64, 128])
def test_forward_space(h100, head_dim):
    configs = forward._fwd_autotuned.configs
    fp32 = forward._prune(configs, _Args(torch.float32), HEAD_DIM=head_dim)
    assert fp32 and all(forward._fits(c, 4, head_dim) for c in fp32)
    assert (128, 128, 3) not in _tiles(fp32, "BLOCK_M", "BLOCK_N")
    bf16 = forward._prune(configs, _Args(torch.bfloat16), HEAD_DIM=64)
    assert (128, 128, 3) in _tiles(bf16, "BLOCK_M", "BLOCK_N")  # the tuned space is kept
    assert (64, 32, 2) not in _tiles(bf16, "BLOCK_M", "BLOCK_N")  # the fallback only where needed


@pytest.mark.parametrize(
    "kernel,fixed,streamed", [("dkdv", "BLOCK_N", "BLOCK_M"), ("dq", "BLOCK_M", "BLOCK_N")]
)
def test_two_pass_spaces(h100, kernel, fixed, streamed):
    autotuned = {"dkdv": backward._dkdv_autotuned, "dq": backward._dq_autotuned}[kernel]
    prune = backward._prune_by(fixed, streamed)
    fp32 = prune(autotuned.configs, _Args(torch.float32), HEAD_DIM=128)
    assert fp32
    for c in fp32:
        rows = {"BLOCK_M": c.kwargs["BLOCK_M"], "BLOCK_N": c.kwargs["BLOCK_N"]}
        need = _common.tile_smem_bytes(
            4, 128, fixed_rows=2 * rows[fixed], streamed_rows=2 * rows[streamed], stages=c.num_stages
        )
        assert need * 1.1 <= HOPPER_SHARED_MEMORY
    assert len(prune(autotuned.configs, _Args(torch.bfloat16), HEAD_DIM=64)) >= 4


def test_fused_space(h100, monkeypatch):
    compiled = []

    class Kernel:
        n_spills = 0

    monkeypatch.setattr(
        fused, "_drop_spilling", lambda configs, compile_for_call: compiled.extend(configs) or configs
    )
    kept = fused._prune(fused._fused_autotuned.configs, _Args(torch.float32, lk=1000), HEAD_DIM=128)
    assert kept and all(fused._fits(c, 4, 128) for c in kept)
    kept16 = fused._prune(fused._fused_autotuned.configs, _Args(torch.bfloat16, lk=1000), HEAD_DIM=64)
    assert len(kept16) >= 4 and not any(c.kwargs["KEYS_WRITE_DQ"] for c in kept16)


def test_fused_space_drops_the_ptxas_crashes_only_where_they_crash(h100, monkeypatch):
    # Lq == Lk == 1 crashes ptxas for nine configs (Triton 3.6.0, sm_90a): they are dropped there,
    # before compiling, and kept at every other shape.
    monkeypatch.setattr(fused, "_drop_spilling", lambda configs, compile_for_call: configs)
    configs = fused._fused_autotuned.configs
    assert len(configs) == len(fused._SEARCH_SPACE)
    crashing = fused._PTXAS_CRASHES_AT_ONE_BY_ONE
    assert len(crashing) == 9 and crashing <= {tuple(t) for t in fused._SEARCH_SPACE}

    def kept(lq, lk):
        args = _Args(torch.bfloat16, lk=lk, lq=lq)
        return {fused._space_tuple(c) for c in fused._prune(configs, args, HEAD_DIM=64)}

    one_by_one = kept(1, 1)
    assert one_by_one and not one_by_one & crashing
    assert kept(1, 100) & crashing and kept(100, 1) & crashing


@pytest.mark.parametrize("kernel", ["fwd", "dq", "dkdv"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_flash_tiles_fit(h100, kernel, head_dim, dtype):
    elem = torch.finfo(dtype).bits // 8
    table = _table_config(kernel, dtype, head_dim, True)
    fitted = _fit(table, kernel, elem, head_dim)
    assert _fits(fitted, kernel, elem, head_dim)
    if _fits(table, kernel, elem, head_dim):
        assert fitted == table  # a tile that fits is never changed


def test_flash_fit_shrinks_what_does_not_fit(h100):
    too_big = TileConfig(128, 128, 8, 3)
    fitted = _fit(too_big, "fwd", 4, 128)
    assert _fits(fitted, "fwd", 4, 128) and fitted.block_m * fitted.block_n < 128 * 128


def test_shared_memory_estimate_of_the_issue():
    # fp32 tiles of 128 x 128 at D = 128 (3 stages) do not fit an H100; bf16 128 x 128 at D = 64 does.
    assert _common.tile_smem_bytes(4, 128, fixed_rows=128, streamed_rows=256, stages=3) > HOPPER_SHARED_MEMORY
    assert (
        _common.tile_smem_bytes(2, 64, fixed_rows=128, streamed_rows=256, stages=3) * 1.1
        < HOPPER_SHARED_MEMORY
    )
    assert triton.next_power_of_2(100) == 128  # the prune's width rule relies on it


def _largest_tile(configs, *names) -> int:
    return max(c.kwargs[names[0]] * c.kwargs[names[1]] for c in configs)


def test_ieee_float32_backward_tunes_only_small_tiles(h100, monkeypatch):
    # IEEE float32 dots run on the FMA units: tiles above 64 x 64 only cost compile time (a float32
    # fused-backward test tuned for 276 s on the H100 before). With TF32 allowed they stay in.
    monkeypatch.setattr(fused, "_drop_spilling", lambda configs, compile_for_call: configs)
    spaces = {
        "dkdv": lambda: backward._prune_by("BLOCK_N", "BLOCK_M")(
            backward._dkdv_autotuned.configs, _Args(torch.float32), HEAD_DIM=64
        ),
        "fused": lambda: fused._prune(
            fused._fused_autotuned.configs, _Args(torch.float32, lk=1000), HEAD_DIM=64
        ),
    }
    names = {"dkdv": ("BLOCK_M", "BLOCK_N"), "fused": ("BLOCK_M1", "BLOCK_N1")}
    assert _common.small_tiles_only(4, 64) and not _common.small_tiles_only(2, 64)
    for kernel, pruned in spaces.items():
        assert _largest_tile(pruned(), *names[kernel]) <= 64 * 64, kernel
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        assert not _common.small_tiles_only(4, 64) and _common.small_tiles_only(4, 128)
        assert _largest_tile(spaces["dkdv"](), *names["dkdv"]) > 64 * 64
    finally:
        torch.set_float32_matmul_precision(previous)
