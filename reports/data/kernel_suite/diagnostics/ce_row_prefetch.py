"""The next row's L2 prefetch (``CrossEntropySettings.row_prefetch``) against none: the plain loss and
each option, forward + backward, bf16, GPU time only (replayed from a CUDA graph behind a 1 ms GPU
sleep, so the host's speed is out of it). Three rounds, the two settings alternating within each, so
that a drift of the GPU's clock falls on both; per cell the median of the rounds, the ratio of
prefetch to none, and each option's ratio to the plain loss under the same setting. Both settings
must give the same bits.

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/ce_row_prefetch.py
"""

import statistics
import sys

import torch

from common.timing import bench, graph_replay
from tritonlab.ops.cross_entropy import CrossEntropyOptions, CrossEntropySettings

sys.path.insert(0, "reports/data/kernel_suite/diagnostics")
from ce_settings_small_vocab import OPTIONS, step_of  # noqa: E402

SETTINGS = {"none": CrossEntropySettings(row_prefetch=False), "prefetch": CrossEntropySettings()}
SHAPES = [(4096, 32000), (16384, 32000), (4096, 128256), (16384, 128256)]
ROUNDS = 3


def main():
    torch.manual_seed(0)
    for rows, vocab in SHAPES:
        logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16)
        target = torch.randint(0, vocab, (rows,), device="cuda")
        gbytes = 2 * logits.numel() * logits.element_size() / 1e9
        times = {}
        for option, options in OPTIONS.items():
            steps = {name: step_of(logits, target, s, options) for name, s in SETTINGS.items()}
            outs = {name: [t.clone() for t in step()] for name, step in steps.items()}
            same = all(torch.equal(a, b) for a, b in zip(outs["none"], outs["prefetch"], strict=True))
            replays = {name: graph_replay(step) for name, step in steps.items()}
            samples = {name: [] for name in SETTINGS}
            for round_ in range(ROUNDS):
                order = list(SETTINGS) if round_ % 2 == 0 else list(reversed(SETTINGS))
                for name in order:
                    samples[name].append(bench(replays[name], head_start_ms=1.0).ms)
            for name in SETTINGS:
                times[option, name] = statistics.median(samples[name])
            none, pre = times[option, "none"], times[option, "prefetch"]
            print(
                f"{rows}x{vocab} {option:9s} none {none * 1e3:7.1f} us  prefetch {pre * 1e3:7.1f} us "
                f"({gbytes / pre * 1e3:5.0f} GB/s)  prefetch/none {pre / none:.3f}  same bits: {same}  "
                f"rounds none {' '.join(f'{s * 1e3:.1f}' for s in samples['none'])}, "
                f"prefetch {' '.join(f'{s * 1e3:.1f}' for s in samples['prefetch'])}",
                flush=True,
            )
        for name in SETTINGS:
            ratios = "  ".join(
                f"{option} {times[option, name] / times['plain', name]:.3f}x" for option in OPTIONS if option != "plain"
            )
            print(f"{rows}x{vocab} {name:8s} against plain: {ratios}", flush=True)


if __name__ == "__main__":
    assert isinstance(OPTIONS["plain"], CrossEntropyOptions)
    main()
