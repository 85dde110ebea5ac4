"""AdamW in one Triton kernel per parameter, which can also write a bf16 copy ("shadow") of each
updated weight for the next forward.

With float32 weights trained under bf16 autocast, every linear layer's forward first casts its
weight to bf16: a copy kernel per weight per step (4 bytes read, 2 written per parameter). The
optimizer step already reads and writes every weight, so writing the cast there costs 2 bytes per
parameter and no launch; :class:`WeightShadows` holds those copies and ``tritonlab.ops.linear(s)``
(``shadows=``) use them instead of casting.

The step, PyTorch's AdamW (``torch.optim.AdamW(capturable=True)``, ``_single_tensor_adam``) in its
order of operations, everything in float32 and t the parameter's step count after this step::

    p  = p * (1 - lr*wd)                         # 1 - lr*wd rounded once, on the host
    m  = lerp(m, g, 1 - b1)                      # m + (1-b1)(g - m), or g - (g - m)b1 when 1-b1 >= 0.5
    v  = v*b2 + (1-b2) * g*g
    step_size_neg = -(lr / (1 - b1**t))
    denom = sqrt(v) / (sqrt(1 - b2**t) * step_size_neg) + eps / step_size_neg
    p  = p + m / denom                           # = p - lr/(1-b1**t) * m / (sqrt(v)/sqrt(1-b2**t) + eps)
    shadow = bf16(p)                             # where p has a shadow

The step count t is a float32 device tensor per parameter (``state[p]["step"]``, as PyTorch's
capturable AdamW keeps it), incremented by one foreach add per param group before the kernels;
each kernel loads it and computes the bias corrections on the device: b**t as exp2(t * log2 b),
log2 b from the host in double precision (PyTorch computes pow(float(b), t) on the device; both
are float32 results within a few ulp). Nothing reads a device value on the host, so the whole
step can be captured in a CUDA graph (``tritonlab.graphs.GraphedStep``); the state is created at
the first step, which GraphedStep's warm-up runs before capture. sqrt and division are the
correctly rounded ones (``sqrt_rn``, ``div_rn``), as PyTorch's CUDA kernels compute them.

Against ``torch.optim.AdamW(foreach=False)`` (not capturable: its bias corrections in double on
the host) the parameters agree to ~1e-7 relative after several steps: the only differences are
float32 bias corrections and the contraction of multiply-adds.

lr and the decay factor 1 - lr*wd (rounded once, on the host) reach the kernel through a small
device tensor per param group, filled at every step: a schedule that changes lr keeps one compiled
launch per parameter shape (the launch cache, ``tritonlab._launch``, keys scalars by value), and
in a captured graph the fill, like PyTorch's, holds the lr of the capture. The betas, eps and
weight_decay are scalars of the launch.
"""

import math

import torch
import triton
import triton.language as tl

from ._launch import LaunchCache, first_launch, launch
from ._runtime import cdiv

__all__ = ["AdamW", "WeightShadows"]

BLOCK = 4096
NUM_WARPS = 8


@triton.jit
def _adamw_kernel(
    P,
    G,
    M,
    V,
    STEP,
    HYPER,
    SHADOW,
    n,
    beta2,
    one_minus_beta1,
    one_minus_beta2,
    log2_beta1,
    log2_beta2,
    eps,
    BLOCK: tl.constexpr,
    LERP_FROM_END: tl.constexpr,
    HAS_DECAY: tl.constexpr,
    HAS_SHADOW: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(P + offs, mask=mask, other=0.0)
    g = tl.load(G + offs, mask=mask, other=0.0)
    m = tl.load(M + offs, mask=mask, other=0.0)
    v = tl.load(V + offs, mask=mask, other=0.0)
    t = tl.load(STEP)  # already incremented for this step
    lr = tl.load(HYPER)
    if HAS_DECAY:
        p = p * tl.load(HYPER + 1)
    # torch.lerp(m, g, w): m + w (g - m) for |w| < 0.5, else g - (g - m)(1 - w)
    m = g - (g - m) * (1.0 - one_minus_beta1) if LERP_FROM_END else m + one_minus_beta1 * (g - m)
    v = v * beta2 + one_minus_beta2 * (g * g)
    bias_correction1 = 1.0 - tl.exp2(t * log2_beta1)
    bias_correction2 = 1.0 - tl.exp2(t * log2_beta2)
    step_size_neg = -tl.div_rn(lr, bias_correction1)
    bias_correction2_sqrt = tl.sqrt_rn(bias_correction2)
    denom = tl.div_rn(tl.sqrt_rn(v), bias_correction2_sqrt * step_size_neg) + tl.div_rn(eps, step_size_neg)
    p = p + tl.div_rn(m, denom)
    tl.store(P + offs, p, mask=mask)
    tl.store(M + offs, m, mask=mask)
    tl.store(V + offs, v, mask=mask)
    if HAS_SHADOW:
        tl.store(SHADOW + offs, p.to(SHADOW.dtype.element_ty), mask=mask)


_LAUNCHES = LaunchCache(first_launch)


def _adamw_launch(p, g, m, v, step, hyper, shadow, *, beta1, beta2, eps, weight_decay) -> None:
    """One parameter's update; ``hyper`` holds (lr, 1 - lr*wd) on the device."""
    n = p.numel()
    launch(
        _LAUNCHES,
        _adamw_kernel,
        (cdiv(n, BLOCK),),
        (p, g, m, v, step, hyper, shadow),
        (
            n,
            float(beta2),
            float(1.0 - beta1),
            float(1.0 - beta2),
            # log2(0) = -inf: b**t = 0, no bias correction, as PyTorch's pow gives for b = 0
            float(math.log2(beta1)) if beta1 > 0 else -math.inf,
            float(math.log2(beta2)) if beta2 > 0 else -math.inf,
            float(eps),
        ),
        {
            "BLOCK": BLOCK,
            "LERP_FROM_END": (1.0 - beta1) >= 0.5,
            "HAS_DECAY": weight_decay != 0,
            "HAS_SHADOW": shadow is not None,
            "num_warps": NUM_WARPS,
        },
    )


class WeightShadows:
    """Copies of chosen float32 parameters in a narrower ``dtype`` (bf16), kept for the forward.

    ``get(weight, dtype)`` gives the copy of ``weight`` when it has one in ``dtype`` and the copy
    is current, else None (the caller casts, as without shadows).

    The currency rule: each shadow remembers ``weight._version`` (PyTorch's count of in-place
    changes) from when it was last written -- by :meth:`refresh` (a full recast: at construction,
    and whenever the caller wants stale shadows current again) or by :class:`AdamW`'s kernel, which
    writes the parameter and its shadow through pointers and so leaves ``_version`` as it was. Any
    other in-place change of the parameter through autograd's view of it -- ``load_state_dict``,
    another optimizer's step, ``with torch.no_grad(): p.add_(1)``, ``p.copy_(...)`` -- bumps
    ``_version``, and ``get`` returns None until the next refresh or AdamW step. Changes through
    ``p.data`` (a tensor with a version counter of its own) and writes by other kernels that bypass
    PyTorch are NOT seen: call :meth:`refresh` after them.
    """

    def __init__(self, params=(), dtype: torch.dtype = torch.bfloat16):
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype: expected a floating-point torch.dtype, got {dtype!r}")
        self.dtype = dtype
        self._entries: dict[int, list] = {}  # id(param) -> [param, shadow, version]
        self.add(params)

    def add(self, params) -> None:
        """Keep a (current) shadow of each of ``params`` too: the model can be built on components
        that hold this object before its parameters exist, and its weights added after."""
        if isinstance(params, torch.Tensor):
            params = [params]
        for i, p in enumerate(params):
            if not isinstance(p, torch.Tensor) or p.dtype != torch.float32:
                what = p.dtype if isinstance(p, torch.Tensor) else type(p).__name__
                raise ValueError(f"params[{i}]: expected a float32 tensor, got {what}")
            if not p.is_contiguous():
                raise ValueError(f"params[{i}]: expected a contiguous tensor")
            if id(p) not in self._entries:
                with torch.no_grad():
                    self._entries[id(p)] = [p, p.to(self.dtype, copy=True), p._version]

    def __len__(self) -> int:
        return len(self._entries)

    def _entry(self, param: torch.Tensor) -> list | None:
        """``[param, shadow, version]`` if ``param`` itself has a shadow (an id can be reused by a
        tensor made after another is freed), else None."""
        entry = self._entries.get(id(param))
        return entry if entry is not None and entry[0] is param else None

    def __contains__(self, param) -> bool:
        return self._entry(param) is not None

    def params(self) -> list[torch.Tensor]:
        return [entry[0] for entry in self._entries.values()]

    def refresh(self, stale_only: bool = False) -> None:
        """Recast every parameter into its shadow (``stale_only``: only those whose ``get`` would
        give None) and mark them current."""
        with torch.no_grad():
            for entry in self._entries.values():
                p, shadow, version = entry
                if stale_only and p._version == version:
                    continue
                shadow.copy_(p)
                entry[2] = p._version

    def get(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """``weight``'s shadow if it has one in ``dtype`` that is current, else None."""
        entry = self._entry(weight)
        if entry is None or dtype != self.dtype or weight._version != entry[2]:
            return None
        return entry[1]

    # --- for the optimizer ------------------------------------------------------------------------

    def buffer(self, param: torch.Tensor) -> torch.Tensor | None:
        """The shadow buffer of ``param`` (current or not), or None: what AdamW's kernel writes."""
        entry = self._entry(param)
        return entry[1] if entry is not None else None

    def mark_written(self, param: torch.Tensor) -> None:
        """The shadow of ``param`` now holds its current value cast (written by a kernel)."""
        self._entries[id(param)][2] = param._version


def _check_hyper(lr, betas, eps, weight_decay) -> None:
    if isinstance(lr, torch.Tensor) or not isinstance(lr, int | float) or not lr >= 0:
        raise ValueError(f"lr: expected a number >= 0 (a tensor lr is not supported), got {lr!r}")
    if not (isinstance(betas, tuple | list) and len(betas) == 2):
        raise ValueError(f"betas: expected a pair (beta1, beta2), got {betas!r}")
    for i, b in enumerate(betas):
        if isinstance(b, torch.Tensor) or not isinstance(b, int | float) or not 0.0 <= b < 1.0:
            raise ValueError(f"betas[{i}]: expected a number in [0, 1), got {b!r}")
    if not isinstance(eps, int | float) or not eps >= 0:
        raise ValueError(f"eps: expected a number >= 0, got {eps!r}")
    if not isinstance(weight_decay, int | float) or not weight_decay >= 0:
        raise ValueError(f"weight_decay: expected a number >= 0, got {weight_decay!r}")


class AdamW(torch.optim.Optimizer):
    """PyTorch's AdamW (decoupled weight decay) on float32 parameters, one Triton kernel launch per
    parameter, CUDA-graph capturable; with ``shadows`` (a :class:`WeightShadows`), the kernel also
    writes the updated value of each parameter it holds into its shadow.

    No amsgrad, maximize, foreach, fused or differentiable options (refused); ``capturable`` is
    always on (the step count lives on the device), so ``tritonlab.graphs.GraphedStep`` accepts it.
    Parameters and their gradients must be float32 and the parameters contiguous.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        shadows: WeightShadows | None = None,
        **unsupported,
    ):
        if unsupported:
            raise ValueError(
                f"{', '.join(sorted(unsupported))}: not options of tritonlab.optim.AdamW (it takes lr, betas, "
                "eps, weight_decay and shadows; no amsgrad, maximize, foreach, fused, capturable or differentiable)"
            )
        _check_hyper(lr, betas, eps, weight_decay)
        if shadows is not None and not isinstance(shadows, WeightShadows):
            raise ValueError(f"shadows: expected a WeightShadows or None, got {type(shadows).__name__}")
        self.shadows = shadows
        self._hyper: dict = {}  # (group index, device) -> float32 (lr, 1 - lr*wd), refilled every step
        defaults = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "capturable": True,  # for GraphedStep's check: the step count and bias corrections are on the device
        }
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _check_hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])
        if not group.get("capturable", True):
            raise ValueError("capturable: tritonlab.optim.AdamW is always capturable; got capturable=False")
        for i, p in enumerate(group["params"]):
            if p.dtype != torch.float32:
                raise ValueError(
                    f"params: parameter {i} of group {len(self.param_groups) - 1} is {p.dtype}, expected float32"
                )
            if not p.is_contiguous():
                raise ValueError(
                    f"params: parameter {i} of group {len(self.param_groups) - 1} is not contiguous"
                )

    def _filled_hyper(self, gi: int, device: torch.device, group: dict) -> torch.Tensor:
        """This group's (lr, 1 - lr*wd) on ``device``, filled now (two kernels, no host sync)."""
        hyper = self._hyper.get((gi, device))
        if hyper is None:
            hyper = self._hyper[gi, device] = torch.empty(2, dtype=torch.float32, device=device)
        lr = float(group["lr"])
        hyper[0].fill_(lr)
        hyper[1].fill_(1.0 - lr * float(group["weight_decay"]))
        return hyper

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            work = []
            for i, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                g = p.grad
                if g.is_sparse or g.dtype != torch.float32 or g.shape != p.shape:
                    raise ValueError(
                        f"grad: parameter {i} of group {gi} has a {'sparse ' if g.is_sparse else ''}"
                        f"{g.dtype} gradient of shape {tuple(g.shape)}; expected dense float32 of shape {tuple(p.shape)}"
                    )
                if not g.is_contiguous():
                    g = g.contiguous()
                state = self.state[p]
                if not state:  # the first step: GraphedStep's warm-up runs it before capture
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                work.append((p, g, state))
            if not work:
                continue
            torch._foreach_add_([state["step"] for _, _, state in work], 1.0)
            hypers = {}
            beta1, beta2 = group["betas"]
            for p, g, state in work:
                if p.device not in hypers:
                    hypers[p.device] = self._filled_hyper(gi, p.device, group)
                hyper = hypers[p.device]
                shadow = self.shadows.buffer(p) if self.shadows is not None else None
                _adamw_launch(
                    p,
                    g,
                    state["exp_avg"],
                    state["exp_avg_sq"],
                    state["step"],
                    hyper,
                    shadow,
                    beta1=float(beta1),
                    beta2=float(beta2),
                    eps=float(group["eps"]),
                    weight_decay=float(group["weight_decay"]),
                )
                if shadow is not None:
                    self.shadows.mark_written(p)
        return loss
