"""Where the host time of one forward + backward goes at the TransformerNP's small shape, where the
call is bound by the host: per implementation, the host's microseconds a call beside the kernels'
(``common.timing.host_and_device_ms``), then for ours a cProfile of 300 calls, top functions by
own time. Inputs and call exactly as phase 04's benchmark makes them.

    PYTHONPATH=. python3 reports/data/04_fused_attn/diagnostics/small_host.py
"""

from functools import partial

import torch

from common.attention_bench import make_inputs, run_case, sdpa_variants, tnp_case
from common.timing import cprofile_calls, host_and_device_ms, top_functions
from tritonlab.attention import attention, fused_attention


def main() -> None:
    q, k, v, do = make_inputs(tnp_case("small"), torch.bfloat16, grad=True)
    print(
        f"# {torch.cuda.get_device_name()}, small: q {tuple(q.shape)}, k {tuple(k.shape)}, bf16", flush=True
    )
    impls = {
        "sdpa-cudnn": sdpa_variants()["sdpa-cudnn"],
        "triton-2pass": attention,
        "triton-fused": fused_attention,
    }
    for name, fn in impls.items():
        call = partial(run_case, fn, q, k, v, do, True)
        for _ in range(20):
            call()
        host_ms, device_ms = host_and_device_ms(call, calls=200)
        print(
            f"{name:14s} host {host_ms * 1e3:7.1f} us a call, kernels {device_ms * 1e3:7.1f} us", flush=True
        )
        if name == "sdpa-cudnn":
            continue
        print(top_functions(cprofile_calls(call, 300), "tottime", 25), flush=True)


if __name__ == "__main__":
    main()
