"""What reading the compute capability once saves a forward + backward at the small TransformerNP
shape: host microseconds a call of the fused attention with ``forward_hopper``'s dispatch asking
``tritonlab._runtime.capability`` (read once) against asking torch on every call, alternating five
rounds in one process (host times move between machines, so only this pairing compares them).

    PYTHONPATH=. python3 reports/data/04_fused_attn/diagnostics/capability_ab.py
"""

import statistics
from functools import partial

import torch

from common.attention_bench import make_inputs, run_case, tnp_case
from common.timing import host_and_device_ms
from tritonlab.attention import forward_hopper, fused_attention


def main() -> None:
    q, k, v, do = make_inputs(tnp_case("small"), torch.bfloat16, grad=True)
    call = partial(run_case, fused_attention, q, k, v, do, True)
    cached = forward_hopper.capability
    per_call = lambda device=None: torch.cuda.get_device_capability(device)
    samples = {"read once": [], "asked every call": []}
    for _ in range(20):
        call()
    for r in range(5):
        for name in samples if r % 2 == 0 else reversed(list(samples)):
            forward_hopper.capability = cached if name == "read once" else per_call
            samples[name].append(host_and_device_ms(call, calls=300)[0] * 1e3)
    forward_hopper.capability = cached
    print(f"# {torch.cuda.get_device_name()}, small, fused attention forward + backward, bf16")
    for name, us in samples.items():
        print(
            f"{name:17s} host {statistics.median(us):6.1f} us a call (rounds {' '.join(f'{u:.1f}' for u in us)})"
        )


if __name__ == "__main__":
    main()
