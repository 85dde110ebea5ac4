"""What the kernels are checked against: attention in float64, and outputs poisoned before a run."""

import contextlib
import math

import torch


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None):
    """(o, lse) in float64 -- differentiable, so autograd through it gives reference gradients."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    return torch.softmax(s, dim=-1) @ v.double(), torch.logsumexp(s, dim=-1)


@contextlib.contextmanager
def poisoned_allocations():
    """Every floating-point ``torch.empty`` inside the block comes back filled with NaN, so an
    output element a kernel forgets to write shows up as NaN instead of as stale memory."""
    original = torch.empty

    def empty(*args, **kwargs):
        t = original(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty = empty
    try:
        yield
    finally:
        torch.empty = original


def strided_inputs(
    B: int, H: int, Lq: int, Lk: int, D: int, dtype, device, scale_inputs: float = 1.0, seed: int = 0
):
    """q, k, v shaped like phase 01's model makes them: transposed views of (B, L, H·D) projections."""
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, Lq, H * D, generator=g, device=device, dtype=torch.float32) * scale_inputs
    kv = torch.randn(B, Lk, 2 * H * D, generator=g, device=device, dtype=torch.float32) * scale_inputs
    q = q.to(dtype).view(B, Lq, H, D).transpose(1, 2)
    kv = kv.to(dtype).view(B, Lk, 2, H, D)
    return q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)


def gradient_errors(
    attention,
    B: int,
    H: int,
    Lq: int,
    Lk: int,
    D: int,
    dtype,
    device,
    scale_inputs: float = 1.0,
    seed: int = 0,
) -> dict:
    """Errors max |ours − float64| / max(max |float64|, 1) of o, dq, dk, dv for ``attention``.

    Relative to the largest reference value, floored at 1 so that a gradient that is exactly
    zero (one key: the softmax is constant) is not divided by nothing. Gradients are poisoned
    allocations too, and must come back finite.
    """
    q, k, v = (
        t.detach().requires_grad_()
        for t in strided_inputs(B, H, Lq, Lk, D, dtype, device, scale_inputs, seed)
    )
    do = torch.randn(
        B, H, Lq, D, generator=torch.Generator(device=device).manual_seed(seed + 1), device=device
    ).to(dtype)
    with poisoned_allocations():
        o = attention(q, k, v)
        grads = torch.autograd.grad(o, (q, k, v), do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o64, _ = reference_attention(q64, k64, v64)
    grads64 = torch.autograd.grad(o64, (q64, k64, v64), do.double())
    errors = {}
    for name, ours, theirs in zip(("o", "dq", "dk", "dv"), (o, *grads), (o64, *grads64), strict=True):
        assert ours.shape == theirs.shape and ours.dtype == dtype, name
        assert torch.isfinite(ours).all(), f"{name}: NaN or inf"
        errors[name] = (ours.double() - theirs).abs().max().item() / theirs.abs().max().clamp_min(1.0).item()
    return errors


def model_gradient_errors(attention, dtype: str = "fp32", seed: int = 0) -> dict:
    """Phase 01's TransformerNP with ``attention`` against the same model on SDPA.

    A small model (2 layers, 2 heads of 16) on the tiny shape, on the CPU in fp32; on a GPU pass
    ``dtype="bf16"`` (autocast) and the small shape's geometry is kept tiny all the same. Returns the
    loss's relative difference and the largest relative difference over every parameter gradient.
    """
    import importlib

    from common import DEVICE, ON_GPU, resolve_shape

    base = importlib.import_module("phases.01_baseline")
    training = importlib.import_module("phases.01_baseline.training")
    cfg = base.TNPConfig(n_layers=2, n_heads=2, head_dim=16, d_ff=48, n_components=3, d_head_hidden=24)
    shape = resolve_shape("tiny")
    tasks = base.sample_tasks(
        shape.batch,
        shape.m_context,
        shape.n_target,
        device=DEVICE,
        generator=torch.Generator(device=DEVICE).manual_seed(seed),
    )
    backend = "cudnn" if ON_GPU and dtype == "bf16" else "math"
    results = []
    for attend in (attention, base.sdpa_attention(backend)):
        model, _ = base.build(cfg, base.Components(attention=attend), seed=seed, device=DEVICE)
        with training.autocast(training.check_dtype(dtype)):
            loss = model.loss(*tasks)
        loss.backward()
        results.append((loss.detach().double(), {n: p.grad.double() for n, p in model.named_parameters()}))
    (loss, grads), (loss_ref, grads_ref) = results
    grad_err = max(
        (grads[n] - g).abs().max().item() / g.abs().max().clamp_min(1e-12).item()
        for n, g in grads_ref.items()
    )
    return {"loss": abs(loss - loss_ref).item() / abs(loss_ref).item(), "grads": grad_err}


def errors_against_sdpa(attention, B: int, H: int, Lq: int, Lk: int, D: int = 64, seed: int = 0) -> dict:
    """Max abs error of o and relative errors of dq, dk, dv against SDPA cuDNN, bf16 on the GPU --
    for shapes too large for a float64 reference (the mid shape)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (
        t.detach().requires_grad_()
        for t in strided_inputs(B, H, Lq, Lk, D, torch.bfloat16, "cuda", seed=seed)
    )
    do = torch.randn(B, H, Lq, D, device="cuda", dtype=torch.bfloat16)
    with poisoned_allocations():
        o = attention(q, k, v)
        grads = torch.autograd.grad(o, (q, k, v), do)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o_ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        grads_ref = torch.autograd.grad(o_ref, (q, k, v), do)
    errors = {"o": (o.float() - o_ref.float()).abs().max().item()}
    for name, a, b in zip(("dq", "dk", "dv"), grads, grads_ref, strict=True):
        errors[name] = (a.float() - b.float()).abs().max().item() / b.float().abs().max().item()
    return errors


def misaligned_inputs(B, H, Lq, Lk, D, dtype, device):
    """Contiguous q, k, v whose data starts one element past a 16-byte boundary."""
    sizes = (B * H * Lq * D, B * H * Lk * D, B * H * Lk * D)
    flat = torch.randn(sum(sizes) + 1, dtype=dtype, device=device)[1:]
    q, k, v = flat.split(sizes)
    return q.view(B, H, Lq, D), k.view(B, H, Lk, D), v.view(B, H, Lk, D)


def misaligned_gradient_error(attention, B, H, Lq, Lk, D, dtype, device, scale: float | None = None) -> float:
    """The largest error of ``attention``'s dQ, dK, dV on ``misaligned_inputs``, relative to the
    largest float64 gradient (floored at 1): what a backward launched from a cache keyed on the
    inputs' layouts must still get right when the alignment or the scale changes."""
    q, k, v = (t.requires_grad_() for t in misaligned_inputs(B, H, Lq, Lk, D, dtype, device))
    do = torch.randn_like(q)
    grads = torch.autograd.grad(attention(q, k, v, scale), (q, k, v), do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    grads64 = torch.autograd.grad(reference_attention(q64, k64, v64, scale)[0], (q64, k64, v64), do.double())
    return max(
        (g.double() - g64).abs().max().item() / max(g64.abs().max().item(), 1)
        for g, g64 in zip(grads, grads64, strict=True)
    )
