"""Cross-entropy launch settings against the vocabulary: the plain loss and each option, forward +
backward, bf16, GPU time only (replayed from a CUDA graph behind a 1 ms GPU sleep, so the host's
speed is out of it), per settings the time and the ratio to the plain loss under the same settings.
At 32 000 logits a row is one 64 KB block: a program's next row is not loaded while it finishes the
last, which more programs per SM might cover.

    PYTHONPATH=. python3 reports/data/kernel_suite/diagnostics/ce_settings_small_vocab.py
"""

import torch

from common.timing import bench, graph_replay
from tritonlab.ops.cross_entropy import CrossEntropyFunction, CrossEntropyOptions, CrossEntropySettings

SETTINGS = {
    "1/SM 32w 64K": CrossEntropySettings(),
    "1/SM 32w 32K": CrossEntropySettings(block_bytes=32768),
    "2/SM 16w 32K": CrossEntropySettings(block_bytes=32768, num_warps=16, programs_per_sm=2),
    "2/SM 16w 64K": CrossEntropySettings(num_warps=16, programs_per_sm=2),
    "4/SM 8w 16K": CrossEntropySettings(block_bytes=16384, num_warps=8, programs_per_sm=4),
}
OPTIONS = {
    "plain": CrossEntropyOptions(),
    "smoothing": CrossEntropyOptions(label_smoothing=0.1),
    "softcap": CrossEntropyOptions(softcap=30.0),
    "zloss": CrossEntropyOptions(lse_square_scale=1e-4),
    "all": CrossEntropyOptions(label_smoothing=0.1, softcap=30.0, lse_square_scale=1e-4),
}
SHAPES = [(4096, 32000), (16384, 32000), (16384, 128256)]


class _Context:
    """What the autograd Function's forward reads of its context: the logits need a gradient."""

    needs_input_grad = (True,) + (False,) * 7


def step_of(logits, target, settings, options):
    """Forward and backward through the Function's own methods: the same kernels, without the autograd
    engine, which refuses to capture a backward into a leaf made on the default stream."""
    one = torch.ones((), dtype=logits.dtype, device=logits.device)

    def step():
        ctx = _Context()
        loss = CrossEntropyFunction.forward(
            ctx, logits, target, -100, "mean", False, False, settings, options
        )
        return loss, CrossEntropyFunction.backward(ctx, one)[0]

    return step


def main():
    torch.manual_seed(0)
    for rows, vocab in SHAPES:
        logits = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16)
        target = torch.randint(0, vocab, (rows,), device="cuda")
        gbytes = 2 * logits.numel() * logits.element_size() / 1e9
        for option, options in OPTIONS.items():
            ref_loss, ref_grad = step_of(logits, target, SETTINGS["1/SM 32w 64K"], options)()
            for name, settings in SETTINGS.items():
                step = step_of(logits, target, settings, options)
                loss, grad = step()
                same = bool(torch.allclose(loss.float(), ref_loss.float(), rtol=1e-3)) and bool(
                    (grad.float() - ref_grad.float()).abs().max() <= 1e-2 * ref_grad.float().abs().max()
                )
                ms = bench(graph_replay(step), head_start_ms=1.0).ms
                print(
                    f"{rows}x{vocab} {option:9s} {name:13s} {ms * 1e3:7.1f} us  {gbytes / ms * 1e3:6.0f} GB/s  "
                    f"same as the default settings: {same}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
