"""Timing on the CPU: medians and quantiles are ordered, stages are all recorded."""

import time

import pytest
import torch

from common import StageTimer, bench
from common.timing import summarize


def test_summarize_orders_quantiles():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert t.ms == 3.0 and t.p20_ms <= t.ms <= t.p80_ms and t.reps == 5


def test_bench_measures_a_sleep():
    t = bench(lambda: time.sleep(0.002), warmup_ms=5, rep_ms=30)
    assert 1.5 < t.ms < 50 and t.reps >= 3


def test_stage_timer_records_every_stage():
    timer = StageTimer()
    for _ in range(3):
        with timer.stage("step"):
            with timer.stage("forward"):
                time.sleep(0.001)
            with timer.stage("backward"):
                time.sleep(0.002)
    stages = timer.summary()
    assert set(stages) == {"step", "forward", "backward"}
    assert stages["step"].reps == 3
    assert stages["step"].ms >= stages["forward"].ms + stages["backward"].ms * 0.9


def test_summarize_one_sample():
    t = summarize([2.5])
    assert (t.ms, t.p20_ms, t.p80_ms, t.reps) == (2.5, 2.5, 2.5, 1)


@pytest.mark.gpu
def test_head_start_keeps_a_host_stall_out_of_the_gpu_time():
    # Each call stalls the host 2 ms before a ~0.1 ms product: without a head start the GPU waits
    # inside the timed interval, with one it finds the product already queued.
    x = torch.randn(2048, 2048, device="cuda")

    def call():
        time.sleep(0.002)
        return x @ x

    plain = bench(call, warmup_ms=5, rep_ms=60, flush_l2=False)
    ahead = bench(call, warmup_ms=5, rep_ms=60, flush_l2=False, head_start_ms=5.0)
    assert plain.ms > 1.5
    assert ahead.ms < 0.5 * plain.ms
