"""Clock and power per attention forward at mid: each implementation runs back to back for a few
seconds while ``nvidia-smi`` samples the SM clock, the board's power and the active clock-limit
reasons every 100 ms; printed per implementation: ms a call, the mean clock and power over its
window, the share of samples with the software power cap (reason 0x4) active, and ms x MHz (the
call's length in millions of cycles, which stays put where only the clock moves). Two rounds, in
opposite orders. The FP8 calls include their K/V quantisation launch.

    PYTHONPATH=. python3 reports/data/05_fp8_attn/diagnostics/fp8_power.py
"""

import functools
import pathlib
import subprocess
import tempfile
import time

import torch

from common.attention_bench import SDPA, make_inputs, sdpa, tnp_case
from tritonlab.attention import attention_forward, fp8_attention_forward

SECONDS = 4.0


def run_for(call, seconds: float) -> tuple[float, float, float]:
    """Calls ``call`` back to back for about ``seconds``: (start, end wall time, ms a call)."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start = time.time()
    begin.record()
    n = 0
    while time.time() - start < seconds:
        for _ in range(10):
            call()
        n += 10
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    return start, time.time(), begin.elapsed_time(end) / n


def samples(path: str) -> list[tuple[float, float, float, int]]:
    """(unix time, SM MHz, watts, clock-limit reasons) per nvidia-smi line."""
    rows = []
    for line in pathlib.Path(path).read_text().splitlines()[1:]:
        stamp, mhz, watts, reasons = (f.strip() for f in line.split(","))
        t = time.mktime(time.strptime(stamp.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float(
            "0." + stamp.split(".")[1]
        )
        rows.append((t, float(mhz.split()[0]), float(watts.split()[0]), int(reasons, 16)))
    return rows


def main():
    print(f"# {torch.cuda.get_device_name()}", flush=True)
    q, k, v = make_inputs(tnp_case("mid"), torch.bfloat16, grad=False)[:3]
    calls = {
        "sdpa-cudnn": functools.partial(sdpa(SDPA["sdpa-cudnn"]), q, k, v),
        "triton (bf16 Gluon)": functools.partial(attention_forward, q, k, v),
        "triton-fp8 (Gluon)": functools.partial(fp8_attention_forward, q, k, v, impl="gluon"),
        "triton-fp8-tl (Triton)": functools.partial(fp8_attention_forward, q, k, v, impl="triton"),
    }
    log = str(pathlib.Path(tempfile.mkdtemp()) / "smi.csv")
    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active",
         "--format=csv", "-lms", "100", "-f", log]
    )  # fmt: skip
    windows = []
    try:
        time.sleep(1.0)
        for r in range(2):
            for label, call in calls.items() if r == 0 else reversed(calls.items()):
                windows.append((r, label, *run_for(call, SECONDS)))
                time.sleep(1.0)
    finally:
        smi.terminate()
        smi.wait()
    rows = samples(log)
    for r, label, start, end, ms in windows:
        inside = [s for s in rows if start + 0.5 <= s[0] <= end]  # past the first half second
        mhz = sum(s[1] for s in inside) / len(inside)
        watts = sum(s[2] for s in inside) / len(inside)
        capped = sum(1 for s in inside if s[3] & 0x4) / len(inside)
        print(f"round {r}: {label:24s} {ms:.3f} ms, {mhz:6.0f} MHz, {watts:5.0f} W, power cap {capped:4.0%} of "
              f"{len(inside)} samples, {ms * mhz / 1e3:.3f} M cycles", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
