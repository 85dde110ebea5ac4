"""A whole training step -- forward, backward and the optimizer step -- captured in one CUDA graph.

A small step is launch-bound: the TransformerNP's step at the small shape launches about a
thousand kernels, and the host's time to launch them (Python, autograd, Triton's and cuBLAS's
launchers) exceeds the GPU's time to run them. A CUDA graph records every launch of the step once;
a replay then launches them all with one call, so the GPU runs back to back and the host is free.

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True, capturable=True)
    step = GraphedStep(model, optimizer, model.loss, example_inputs, autocast_dtype=torch.bfloat16)
    for batch in batches:                 # every batch of example_inputs' shapes and dtypes
        loss = step.step(*batch)          # copies the batch in, replays forward + backward + AdamW

``loss_fn`` may be compiled (``torch.compile(model.loss, fullgraph=True)``, our kernels as custom
ops): the warm-up compiles it and the capture records Inductor's kernels with ours. A compiled step
that waits on the host between its kernels gains the most (phase 12 at small: 30.1 → 23.8 ms).

How (PyTorch's whole-network capture recipe, "CUDA Graphs" in the CUDA semantics notes):

- **Static inputs.** The graph reads fixed addresses, so the inputs live in buffers of ours;
  ``step`` copies each batch into them (shapes and dtypes must be those of ``example_inputs``) and
  returns the graph's own loss tensor, which the next replay overwrites (``clone()`` it to keep it).
- **Warm-up on a side stream.** ``warmup`` ordinary steps first run on a side stream: the first
  calls of a kernel compile it, autotune it (our Triton kernels time their configs on their first
  call, ``tritonlab._launch``), allocate cuBLAS/cuDNN workspaces and the optimizer's state -- work
  that synchronises with the host and so cannot happen during capture. Afterwards the parameters
  and the optimizer's state are put back as they were (``restore=True``; state the warm-up created
  is zeroed, which is exactly AdamW's and Adam's fresh state; ``tritonlab.optim.AdamW``'s weight
  shadows are recast from the restored weights), so the first replay is the model's
  first step. The copy they are put back from sits in host memory while the warm-up runs: on the
  GPU it would cost as much again as the weights and the optimizer's state (float32 weights and
  AdamW's two moments: 12 bytes a parameter, 41 GB for 3.4 B parameters), for seconds of copying
  at setup.
- **Gradients.** Before capture the gradients are set to None, so the captured backward allocates
  them in the graph's memory pool and every replay overwrites them (the first accumulation of a
  backward assigns): no zeroing is needed, as in the recipe; ``param.grad`` then holds the last
  replay's gradients. Do not call ``optimizer.zero_grad()`` between replays.
- **The optimizer** must be built with ``capturable=True`` (its step counter and bias corrections
  stay on the GPU; ``fused=True`` is fine); a number ``lr`` is baked into the graph as it was at
  capture -- pass a tensor ``lr`` to change it between replays.
- **Autocast** runs with ``cache_enabled=False`` inside the graph, as PyTorch's AMP notes prescribe
  for captured regions (the casts' values are the same).
- **Nothing may synchronise with the host during capture**: ``.item()``, ``.cpu()``, ``print`` of a
  tensor, ``torch.cuda.synchronize()``, a check that reads a device value on the host, or an
  autotuner timing configs because it meets a call signature the warm-up did not. CUDA refuses
  such calls while a stream captures; ``GraphedStep`` then raises a ``RuntimeError`` naming the
  stage (forward, backward, optimizer), the function that made the call and the likely cause,
  instead of CUDA's bare "operation not permitted when stream is capturing".
  tritonlab's kernels are capture-safe after their first call on a signature: their launches only
  read host-side shapes, strides and cached compiled kernels.

On a machine without CUDA, constructing a ``GraphedStep`` raises a ``RuntimeError``.
"""

import contextlib
import os
import traceback
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ._runtime import join_preload

__all__ = ["GraphCaptureError", "GraphedStep", "check_capturable"]

_HERE = os.path.abspath(__file__)
_LIBRARY_DIRS = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep
    for m in (torch, __import__("triton"))
    if getattr(m, "__file__", None)
)
# Phrases of the errors CUDA and PyTorch raise when a stream-capture rule is broken.
# Any CUDA error raised while the step is being captured counts: the step ran eagerly in the warm-up.
_CAPTURE_PHRASES = ("capturing", "capture", "cudaErrorStreamCapture", "operation not permitted", "CUDA error")


class GraphCaptureError(RuntimeError):
    """The step could not be captured in a CUDA graph; the message says where and why."""


def check_capturable(optimizer: torch.optim.Optimizer) -> None:
    """A ``ValueError`` naming ``optimizer`` unless every parameter group has ``capturable=True``."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    groups = [i for i, g in enumerate(optimizer.param_groups) if not g.get("capturable", False)]
    if groups:
        how = (
            "it has no capturable option"
            if "capturable" not in optimizer.defaults
            else f"param group(s) {groups} have capturable=False"
        )
        raise ValueError(
            f"optimizer: a CUDA-graphed step needs an optimizer built with capturable=True "
            f"(e.g. torch.optim.AdamW(params, fused=True, capturable=True)); {type(optimizer).__name__}: {how}"
        )


def _autocast(dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=dtype, cache_enabled=False)


class GraphedStep:
    """``loss_fn(*inputs)``, its backward and ``optimizer.step()`` captured as one CUDA graph.

    ``model``: the module whose parameters the step trains (all on one CUDA device). ``optimizer``:
    built with ``capturable=True`` (a ``ValueError`` otherwise). ``loss_fn``: returns the scalar loss
    of a batch, e.g. ``model.loss``. ``example_inputs``: a batch (CUDA tensors) of the shapes and
    dtypes every later batch has; the warm-up and the capture run on copies of it. ``warmup``:
    ordinary steps before capture (>= 1; they compile and autotune the kernels). ``autocast_dtype``:
    run the forward under ``torch.autocast("cuda", dtype)`` (None: no autocast). ``restore``: put the
    parameters and optimizer state back after the warm-up (exact for Adam/AdamW; with ``False`` the
    warm-up's steps train on ``example_inputs``).

    ``step(*inputs)`` copies the batch into the static inputs, replays, and returns the static loss
    tensor (overwritten by the next replay). A component that synchronises with the host during
    capture raises :class:`GraphCaptureError` (a ``RuntimeError``) from the constructor.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[..., Tensor],
        example_inputs: Sequence[Tensor],
        warmup: int = 3,
        *,
        autocast_dtype: torch.dtype | None = None,
        restore: bool = True,
    ):
        if not isinstance(model, nn.Module):
            raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        check_capturable(optimizer)
        if not callable(loss_fn):
            raise ValueError(f"loss_fn: expected a callable returning the loss, got {type(loss_fn).__name__}")
        if isinstance(example_inputs, Tensor):
            example_inputs = (example_inputs,)
        example_inputs = tuple(example_inputs)
        if not example_inputs or not all(isinstance(t, Tensor) for t in example_inputs):
            raise ValueError("example_inputs: expected a non-empty sequence of tensors (one batch)")
        if not isinstance(warmup, int) or warmup < 1:
            raise ValueError(
                f"warmup: at least 1 step must run before capture (it tunes kernels), got {warmup}"
            )
        from .optim import AdamW as _TritonAdamW

        if restore and not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW | _TritonAdamW):
            raise ValueError(
                f"optimizer: restore=True zeroes the state the warm-up creates, which is a fresh state only "
                f"for Adam and AdamW, not {type(optimizer).__name__}; pass restore=False"
            )
        if not torch.cuda.is_available():
            raise RuntimeError(
                "CUDA graphs need a CUDA GPU: torch.cuda.is_available() is False on this machine; "
                "run the plain (eager) training step instead"
            )
        params = list(model.parameters())
        for i, t in enumerate(example_inputs):
            if t.device.type != "cuda":
                raise ValueError(f"example_inputs[{i}]: expected a CUDA tensor, got one on {t.device}")
        off = [n for n, p in model.named_parameters() if p.device.type != "cuda"]
        if off:
            raise ValueError(f"model: parameters not on a CUDA device: {', '.join(off[:5])}")

        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.autocast_dtype = autocast_dtype
        self.stage = "setup"
        # Static inputs: our own buffers, which the graph reads and step() refills.
        self.static_inputs = tuple(t.detach().clone() for t in example_inputs)
        saved = self._snapshot(params) if restore else None
        self._stream = torch.cuda.Stream()
        self._stream.wait_stream(torch.cuda.current_stream())  # after the copies above
        with torch.cuda.stream(self._stream):
            for _ in range(warmup):
                self.optimizer.zero_grad(set_to_none=True)
                self._body()
            if saved is not None:
                self._restore(params, saved)
        torch.cuda.current_stream().wait_stream(self._stream)
        self.optimizer.zero_grad(set_to_none=True)  # the captured backward allocates the gradients
        self.graph = torch.cuda.CUDAGraph()
        self.static_loss = self._capture()

    # --- the step ----------------------------------------------------------------------------------

    def _body(self) -> Tensor:
        self.stage = "forward"
        with _autocast(self.autocast_dtype):
            loss = self.loss_fn(*self.static_inputs)
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise ValueError(f"loss_fn: expected a scalar loss tensor, got {type(loss).__name__}")
        self.stage = "backward"
        loss.backward()
        self.stage = "optimizer"
        self.optimizer.step()
        self.stage = "done"
        return loss.detach()

    def _capture(self) -> Tensor:
        join_preload()  # its warm-up launches must not fall inside the capture
        torch.cuda.synchronize()
        # The warm-up's activations sit in the caching allocator's ordinary pool; the graph gets a pool
        # of its own, so hand them back first (as torch.cuda.graph does), or a large step holds both.
        torch.cuda.empty_cache()
        failure: BaseException | None = None
        loss = None
        with torch.cuda.stream(self._stream):
            self.graph.capture_begin(capture_error_mode="global")
            try:
                loss = self._body()
            except Exception as err:  # the capture is ended below either way, then reported
                failure = err
            stage = self.stage if failure is not None else "end of the capture"
            try:
                self.graph.capture_end()
            except RuntimeError as err:
                if failure is None:
                    failure = err
        if failure is not None:
            with contextlib.suppress(RuntimeError):
                torch.cuda.synchronize()
            self.graph = None
            _end_rng_capture(self._stream)
            raise GraphCaptureError(_explain(failure, stage)) from failure
        torch.cuda.current_stream().wait_stream(self._stream)
        return loss

    def step(self, *inputs: Tensor) -> Tensor:
        """Copy ``inputs`` (a batch of the example's shapes and dtypes) into the static inputs and
        replay forward, backward and optimizer step; returns the static loss tensor."""
        if len(inputs) != len(self.static_inputs):
            raise ValueError(f"inputs: expected {len(self.static_inputs)} tensors, got {len(inputs)}")
        for i, (static, t) in enumerate(zip(self.static_inputs, inputs, strict=True)):
            if t is static:
                continue
            if not isinstance(t, Tensor) or t.shape != static.shape or t.dtype != static.dtype:
                got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(
                    f"inputs[{i}]: the graph was captured for {tuple(static.shape)} {static.dtype}, got {got}"
                )
            static.copy_(t, non_blocking=True)
        self.graph.replay()
        return self.static_loss

    __call__ = step

    # --- warm-up restore -------------------------------------------------------------------------------

    def _snapshot(self, params: list[Tensor]) -> tuple[list[Tensor], dict]:
        """Host copies of the parameters and the optimizer's tensor state (blocking copies, so they
        hold the values from before the warm-up the side stream starts after them)."""

        def host(t: Tensor) -> Tensor:
            return t.detach().to("cpu", copy=True)

        state = {
            id(p): {k: host(v) for k, v in self.optimizer.state[p].items() if isinstance(v, Tensor)}
            for p in params
            if p in self.optimizer.state
        }
        return [host(p) for p in params], state

    def _restore(self, params: list[Tensor], saved: tuple[list[Tensor], dict]) -> None:
        """Parameters and optimizer state back as before the warm-up, in place (same addresses)."""
        values, state = saved
        with torch.no_grad():
            for p, v in zip(params, values, strict=True):
                p.copy_(v)
            for p in params:
                before = state.get(id(p))
                for k, t in self.optimizer.state.get(p, {}).items():
                    if not isinstance(t, Tensor):
                        continue
                    if before is not None and k in before:
                        t.copy_(before[k])
                    else:
                        t.zero_()  # AdamW's fresh state: step 0, zero moments
            # tritonlab.optim.AdamW's weight shadows: the copies above made them stale (and they hold
            # the warm-up's values); recast now, so the captured forward reads them, not a cast.
            shadows = getattr(self.optimizer, "shadows", None)
            if shadows is not None:
                shadows.refresh()


def _explain(err: BaseException, stage: str) -> str:
    """What could not be captured, where, and the likely cause, from ``err`` and its chain."""
    chain, seen = [], set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        chain.append(e)
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    original = chain[-1] if len(chain) > 1 and _is_capture_error(chain[-1]) else err
    frames = [f for e in chain for f in traceback.extract_tb(e.__traceback__)]
    ours = [f for f in frames if not _library_frame(f.filename)]
    where = f"{ours[-1].name} ({_short(ours[-1].filename)}:{ours[-1].lineno})" if ours else "unknown code"
    autotuning = any(
        "autotuner" in f.filename or f.name in ("do_bench", "autotune_for_launch", "_bench") for f in frames
    )
    message = str(original).strip().splitlines()[0] if str(original).strip() else type(original).__name__
    if autotuning:
        cause = (
            "a Triton autotuner timed its configs during capture (a call signature the warm-up did not "
            "see: warm up on inputs of the same shapes, dtypes and layouts)"
        )
    elif any(_is_capture_error(e) for e in chain):
        cause = (
            "it synchronises with the host or reads a device value on it (.item(), .cpu(), .tolist(), "
            "bool(tensor), torch.cuda.synchronize(), a check of tensor values), which CUDA forbids while "
            "a stream captures; do it before capture or skip it while "
            "torch.cuda.is_current_stream_capturing()"
        )
    else:
        cause = "it raised during capture"
    return (
        f"cannot capture the training step in a CUDA graph: the {stage} failed in {where}: {cause}. "
        f"Original error: {type(original).__name__}: {message}"
    )


def _end_rng_capture(stream: torch.cuda.Stream) -> None:
    """Close the CUDA RNG's capture state after a failed capture. ``capture_end`` raises before it
    tells the default generator that capture is over, and every later random op on the device then
    fails ("Offset increment outside graph capture encountered unexpectedly"): seen on the H100, a
    test after a failed capture. A tiny capture that succeeds ends the generator's state properly."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        torch.empty(1, device=stream.device).zero_()
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)


def _is_capture_error(err: BaseException) -> bool:
    text = str(err)
    return isinstance(err, RuntimeError) and any(p in text for p in _CAPTURE_PHRASES)


def _library_frame(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path == _HERE or path.startswith(_LIBRARY_DIRS) or "<frozen" in filename


def _short(filename: str) -> str:
    try:
        return os.path.relpath(filename)
    except ValueError:
        return filename
