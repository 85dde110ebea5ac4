"""What the TMA kernel's autotuner measured for each config (stream-K ones included) at bert-base's
two dX GEMMs, N = all rows, bf16: Triton's do_bench medians in ms, as the tuner saw them. Run on the
H100 at f3c10cd from the repository root: `python3 reports/data/sparse_ffn/diagnostics/stream_k/tuner_timings.py`
(OUT=<dir> for the CSV)."""

import csv
import os

import torch

from tritonlab import sparse_ffn
from tritonlab.tuning import describe_config

os.environ["TRITONLAB_AUTOTUNE"] = "full"
rows = []
for T, K, D in [(4096, 3072, 768), (4096, 768, 3072), (16384, 3072, 768), (16384, 768, 3072)]:
    torch.manual_seed(0)
    dy = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(K, D, device="cuda", dtype=torch.bfloat16) / K**0.5).to(torch.bfloat16)
    sparse_ffn.fixed_slice_matmul(dy, w, T)
    for config, timing in sparse_ffn._fixed_slice_matmul_tma.configs_timings.items():
        ms = float(timing[0] if isinstance(timing, list | tuple) else timing)
        rows.append({"T": T, "K": K, "D": D, "config": describe_config(config), "tuner_ms": ms})
        print(T, K, D, f"{ms:.4f}", describe_config(config), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "tuner_timings.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
