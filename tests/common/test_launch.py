"""common.launch: the cache key must change whenever Triton's specialisation could."""

import torch

from common.launch import constexpr_tail, signature_key


def test_signature_key_tells_apart_what_specialises_a_kernel():
    flat = torch.zeros(65, dtype=torch.float16)
    base = flat[:64].view(4, 16)
    same = torch.zeros(4, 16, dtype=torch.float16)
    assert signature_key(base) == signature_key(same)  # fresh data, same signature: one launch
    assert signature_key(base) != signature_key(flat[1:].view(4, 16))  # 2 bytes off alignment
    assert signature_key(base) != signature_key(base.t())  # strides
    assert signature_key(base) != signature_key(base.float())  # dtype
    assert signature_key(base) != signature_key(flat[:60].view(4, 15))  # shape


def test_constexpr_tail_follows_the_kernel_parameter_order():
    class Kernel:
        arg_names = ["X", "n", "BLOCK", "EVEN"]

    assert constexpr_tail(Kernel, 2, {"EVEN": True, "BLOCK": 64, "unused": 1}) == (64, True)
