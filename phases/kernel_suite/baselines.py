"""What our kernels are measured against: PyTorch eager (also the fp32 reference), torch.compile of the
same function, and Liger-Kernel where it has the op. Liger-Kernel is optional: without it those cells
are recorded as skipped, with the reason."""

import importlib

import torch
import torch.nn.functional as F

from .fp8 import FP8_DTYPE, FP8_MAX


def rms_norm_eager(x, weight, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)  # PyTorch's fused RMSNorm, fp32 accumulation


def gelu_eager(x, approximate="none"):
    return F.gelu(x, approximate=approximate)


def swiglu_eager(gate, up):
    return F.silu(gate) * up


def rope_eager(q, k, cos_full, sin_full):
    """The Hugging Face formulation on (B, T, H, D): ``x*cos + rotate_half(x)*sin``, cos/sin of (T, D)."""
    cos, sin = cos_full[None, :, None, :], sin_full[None, :, None, :]

    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def cross_entropy_eager(logits, target, ignore_index=-100):
    # The usual training recipe upcasts the logits for a stable log-softmax.
    return F.cross_entropy(logits.float(), target, ignore_index=ignore_index)


def fp8_eager(x, granularity="row", block=128):
    rows = x.reshape(*x.shape[:-1], -1, block) if granularity == "block" else x.unsqueeze(-2)
    amax = rows.abs().amax(dim=-1, keepdim=True).float()
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (rows.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(x.shape), scale.squeeze(-1)


def liger_ops(kernels) -> dict:
    """{kernel: callable or reason it is skipped}; every one of ``kernels`` a reason when Liger-Kernel is
    not installed."""
    try:
        rms = importlib.import_module("liger_kernel.ops.rms_norm")
        swi = importlib.import_module("liger_kernel.ops.swiglu")
        rope_mod = importlib.import_module("liger_kernel.ops.rope")
        ce = importlib.import_module("liger_kernel.ops.cross_entropy")
    except Exception as err:  # ImportError, or a Triton/driver error on import
        reason = f"liger-kernel not importable ({type(err).__name__}: {err})"[:200]
        return dict.fromkeys(kernels, reason)

    def liger_rope(q, k, cos_full, sin_full):
        # Liger takes (B, H, T, D) views of (B, T, H, D) storage: exactly our layout, transposed.
        q_out, k_out = rope_mod.LigerRopeFunction.apply(
            q.transpose(1, 2), k.transpose(1, 2), cos_full, sin_full
        )
        return q_out.transpose(1, 2), k_out.transpose(1, 2)

    def liger_ce(logits, target):
        return ce.LigerCrossEntropyFunction.apply(logits, target, None, -100)[0]

    return {
        "rms_norm": lambda x, w: rms.LigerRMSNormFunction.apply(x, w, 1e-6),
        "gelu": "Liger-Kernel 0.8.5 has no standalone GELU (only GEGLU)",
        "swiglu": swi.LigerSiLUMulFunction.apply,
        "rope": liger_rope,
        "cross_entropy": liger_ce,
        "fp8_row": "Liger-Kernel 0.8.5 has no FP8 quantisation",
        "fp8_block": "Liger-Kernel 0.8.5 has no FP8 quantisation",
    }
