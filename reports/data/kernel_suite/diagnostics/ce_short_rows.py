"""Short rows on two programs an SM (``SHORT_ROW_SETTINGS``) against one (``DEFAULT_SETTINGS``): the
plain loss and each option, forward + backward, bf16, GPU time only (replayed from a CUDA graph behind a
1 ms GPU sleep, so the host's speed is out of it). Three rounds, the two settings alternating within
each, so that a drift of the GPU's clock falls on both; per cell the median of the rounds, and each
option's ratio to the plain loss under the same settings. Both settings must give the same loss and
gradient within two bf16 roundings (their blocks, hence their sums, differ).

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/ce_short_rows.py [ROWSxVOCAB ...]
"""

import statistics
import sys

import torch

from common.timing import bench, graph_replay
from tritonlab.ops.cross_entropy import DEFAULT_SETTINGS, SHORT_ROW_SETTINGS

sys.path.insert(0, "reports/data/kernel_suite/diagnostics")
from ce_settings_small_vocab import OPTIONS, step_of  # noqa: E402

SETTINGS = {"one/SM": DEFAULT_SETTINGS, "two/SM": SHORT_ROW_SETTINGS}
SHAPES = [(4096, 32000), (16384, 32000), (8192, 50257), (8192, 65536), (4096, 128256)]
ROUNDS = 3


def compare(settings: dict, shapes, options=OPTIONS):
    """Per shape and option, each of ``settings`` (two, by name) timed from a CUDA graph, alternating."""
    torch.manual_seed(0)
    first, second = settings
    for rows, vocab in shapes:
        logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16)
        target = torch.randint(0, vocab, (rows,), device="cuda")
        gbytes = 2 * logits.numel() * logits.element_size() / 1e9
        times = {}
        for option, opts in options.items():
            steps = {name: step_of(logits, target, s, opts) for name, s in settings.items()}
            (loss_a, grad_a), (loss_b, grad_b) = ([t.float() for t in step()] for step in steps.values())
            same = bool(torch.allclose(loss_a, loss_b, rtol=2**-7)) and bool(
                (grad_a - grad_b).abs().max() <= 2**-7 * grad_a.abs().max()
            )
            replays = {name: graph_replay(step) for name, step in steps.items()}
            samples = {name: [] for name in settings}
            for round_ in range(ROUNDS):
                order = list(settings) if round_ % 2 == 0 else list(reversed(settings))
                for name in order:
                    samples[name].append(bench(replays[name], head_start_ms=1.0).ms)
            cells = []
            for name in settings:
                times[option, name] = statistics.median(samples[name])
                cells.append(
                    f"{name} {times[option, name] * 1e3:7.1f} us ({gbytes / times[option, name] * 1e3:5.0f} GB/s; "
                    f"rounds {' '.join(f'{s * 1e3:.1f}' for s in samples[name])})"
                )
            ratio = times[option, second] / times[option, first]
            print(
                f"{rows}x{vocab} {option:9s} {'  '.join(cells)}  {second}/{first} {ratio:.3f}  agree: {same}",
                flush=True,
            )
        if "plain" in options:
            for name in settings:
                ratios = "  ".join(
                    f"{option} {times[option, name] / times['plain', name]:.3f}x"
                    for option in options
                    if option != "plain"
                )
                print(f"{rows}x{vocab} {name} against plain: {ratios}", flush=True)


def shapes_from_argv(default: list) -> list:
    """The command line's ROWSxVOCAB shapes, else ``default``."""
    return [tuple(int(n) for n in arg.split("x")) for arg in sys.argv[1:]] or default


if __name__ == "__main__":
    compare(SETTINGS, shapes_from_argv(SHAPES))
