"""The Python that a cross-entropy call runs before and around its launches, plain and with the
options: the launches replaced by no-ops, CPU tensors (64 x 320), forward + backward, 500 calls in
five repeats, the median per call. Shows whether the options' host path costs more than the plain
loss's apart from the launches themselves.

    TRITON_INTERPRET=1 PYTHONPATH=. python reports/data/kernel_suite/diagnostics/ce_host_python.py
"""

import statistics
import sys
import time

import torch

import tritonlab.ops.cross_entropy  # noqa: F401  (the module, not the function tritonlab.ops exports)
from tritonlab import ops

SETS = {
    "plain": {},
    "smoothing": {"label_smoothing": 0.1},
    "all": {"label_smoothing": 0.1, "softcap": 30.0, "lse_square_scale": 1e-4},
}


def main():
    module = sys.modules["tritonlab.ops.cross_entropy"]
    module._launch = lambda *args, **kwargs: None
    module.launch = lambda *args, **kwargs: None
    logits = torch.randn(64, 320, requires_grad=True)
    target = torch.randint(0, 320, (64,))
    for name, options in SETS.items():

        def call(options=options):
            loss = ops.cross_entropy(logits, target, check_targets=False, **options)
            return torch.autograd.grad(loss, logits)

        for _ in range(100):
            call()
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(500):
                call()
            samples.append((time.perf_counter() - start) / 500 * 1e6)
        print(
            f"{name}: {statistics.median(samples):.1f} us a call (repeats {' '.join(f'{s:.1f}' for s in samples)})"
        )


if __name__ == "__main__":
    main()
