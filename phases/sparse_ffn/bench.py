"""Phase sparse_ffn's cells. The sliced backward is numerically WRONG for training: a measurement only.

- kernel cells (``part`` = "kernel"): the two dX GEMMs of the model's FFN layer at T = batch·seq
  rows, ``intermediate`` (dY (T, FFN) @ W (FFN, H)) and ``output`` (dY (T, H) @ W (H, FFN)), for
  N rows (a fraction of T, or a row count): ``ours`` (``fixed_slice_matmul``: the slice plus the
  zero rows, one launch; on Hopper its TMA, short-slice or Gluon kernel), ``ours-pointer`` (the same with ``impl="pointer"``,
  the kernel every other GPU runs), ``cublas-slice`` (``torch.matmul`` on dy[:N], no zero rows written),
  ``cublas-slice-zeros`` (the same output as ours, made by torch: the rows past N zeroed, then cuBLAS
  writes the slice in place) and
  ``cublas-full`` (on all of dY: what the unmodified backward does). Checked against the float32
  product of the slice first. ``ms`` is the GPU's time (each call queued behind a GPU sleep, so
  the host's launch cost stays out of it); ``host_ms`` what one call costs the CPU, ``device_ms``
  its kernels' summed durations (profiler).
- model cells (``part`` = "model"): a BERT or RoBERTa sequence classifier (two labels, as the GLUE
  tasks used here have) fed a GLUE task's rows (``data``), ``original`` and ``sliced``
  (``replace_ffn`` with N rows) forward and forward+backward ms of the loss; backward = the
  difference. The forwards are checked identical first.
- profile rows (``part`` = "profile", ``--profile``): the top operations of one backward of the
  original model by self time, from ``torch.profiler``: CUDA kernels by CUDA time on a GPU, CPU
  operators by CPU time on the CPU (``clock`` says which).

Models: a name of :data:`MODELS` is built from its published sizes with random weights; a local
directory or a name in the Hugging Face cache is read with ``local_files_only`` (its weights are
used where present). On the CPU every model is its family's tiny config (random weights) in
Triton's interpreter, where nothing is measured.
"""

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from common import ON_GPU, Cell, check_close, timed
from common.timing import cuda_kernel_events, graph_replay, host_and_device_ms
from tritonlab.sparse_ffn import fixed_slice_matmul, replace_ffn
from tritonlab.testing import dtype_name, rel_err
from tritonlab.tuning import ConfigRecord

from .data import NUM_LABELS, Sample, Tokenizer, encode

# (batch, sequence) per --shape; on the CPU only the tiny one runs.
SHAPES = {"tiny": (2, 8), "32x128": (32, 128), "32x512": (32, 512), "8x512": (8, 512)}
GPU_SHAPES = ("32x128", "32x512", "8x512")
CPU_MAX_ROWS = 128  # batch·seq the interpreter finishes in seconds with the tiny model
FRACTIONS = (0.0, 0.125, 0.25, 0.5, 1.0)
PARTS = ("kernel", "model")
KERNEL_VARIANTS = ("ours", "ours-pointer", "cublas-slice", "cublas-slice-zeros", "cublas-full")
KERNEL_HEAD_START_MS = 1.0  # longer than any variant's host time per call (host_ms)
TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
PROFILE_TOP = 15

_ROBERTA = {"vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-5}
_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
# The built-in names and their published sizes (BertConfig's defaults are bert-base-uncased's).
MODELS = {
    "bert-base-uncased": ("bert", {}),
    "bert-large-uncased": ("bert", _LARGE),
    "roberta-base": ("roberta", _ROBERTA),
    "roberta-large": ("roberta", {**_ROBERTA, **_LARGE}),
}
# The CPU's model: every family's config shrunk to what the interpreter runs in seconds.
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 48,
        "max_position_embeddings": CPU_MAX_ROWS + 2}  # fmt: skip
# RoBERTa's position ids start after its padding id: a sequence takes that many more positions.
_POSITION_OFFSET = {"bert": 0, "roberta": 2}


def device() -> str:
    return "cuda" if ON_GPU else "cpu"


def bench_kw() -> dict:
    return {} if ON_GPU else {"warmup_ms": 1.0, "rep_ms": 1.0, "min_reps": 1}


def slices(rows: int, fractions=None, n_rows=None) -> list[tuple[float, int]]:
    """(fraction, N) per slice at ``rows`` = batch·seq: ``n_rows`` as given (fraction N/rows) if any,
    else N = round(fraction·rows) per fraction."""
    if n_rows:
        return [(n / rows, n) for n in n_rows]
    return [(f, int(round(f * rows))) for f in fractions]


# --- the model ------------------------------------------------------------------------------------


@dataclass
class ModelSpec:
    name: str
    family: str  # "bert" or "roberta"
    config: object  # the transformers config the model is built from (two labels)
    local: bool  # the config was found locally: the weights are used where they are there too
    tiny: bool  # the CPU's shrunken config

    @property
    def max_seq(self) -> int:
        return self.config.max_position_embeddings - _POSITION_OFFSET[self.family]


def resolve_model(name: str, tiny: bool = not ON_GPU) -> ModelSpec:
    """``name``'s config: a local directory or the Hugging Face cache (never the network), else a
    built-in name's published sizes. ``tiny``: shrunk to :data:`TINY` (the CPU's)."""
    try:
        import transformers
    except ImportError:
        raise ValueError(
            "--model: BERT and RoBERTa need `transformers` (the project's `hf` dependency group: "
            "`uv sync --group hf`)"
        ) from None

    try:
        config = transformers.AutoConfig.from_pretrained(name, local_files_only=True)
        local = True
    except OSError:
        if name not in MODELS:
            raise ValueError(
                f"--model: {name!r} is neither a local model (a directory or a name in the Hugging Face "
                f"cache) nor one of {', '.join(MODELS)}"
            ) from None
        family, sizes = MODELS[name]
        config_cls = {"bert": transformers.BertConfig, "roberta": transformers.RobertaConfig}[family]
        config = config_cls(**sizes)
        local = False
    if config.model_type not in _POSITION_OFFSET:
        raise ValueError(
            f"--model: {name!r} is a {config.model_type} model; only BERT and RoBERTa FFN layers are replaced"
        )
    config.num_labels = NUM_LABELS
    if tiny:
        for key, value in TINY.items():
            setattr(config, key, value)
    return ModelSpec(name, config.model_type, config, local, tiny)


def build_model(spec: ModelSpec, tokenizer: Tokenizer, dtype: torch.dtype):
    """The sequence classifier of ``spec`` in training mode and ``dtype``, and what its weights are.
    The tiny model's vocabulary is the tokenizer's; a bigger tokenizer than a model's is refused."""
    import transformers

    cls = {
        "bert": transformers.BertForSequenceClassification,
        "roberta": transformers.RobertaForSequenceClassification,
    }[spec.family]
    config = copy.deepcopy(spec.config)
    if spec.tiny:
        config.vocab_size = len(tokenizer)
    if len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"--tokenizer: its vocabulary ({len(tokenizer)}) is larger than the model's ({config.vocab_size})"
        )
    torch.manual_seed(0)
    weights = f"random ({'tiny ' if spec.tiny else ''}{spec.family} config)"
    model = None
    if spec.local and not spec.tiny:
        try:
            model = cls.from_pretrained(spec.name, config=config, local_files_only=True)
            weights = "pretrained (local; classifier head random where absent)"
        except OSError:  # a config without weights beside it: random weights, said so in the rows
            weights = "random (local config, no local weights)"
    if model is None:
        model = cls(config)
    return model.to(device=device(), dtype=dtype).train(), weights


# --- cells ----------------------------------------------------------------------------------------


def kernel_cells(
    shapes, fractions, dtype: torch.dtype, hidden: int, intermediate: int, n_rows=None
) -> Iterator[Cell]:
    """``shapes``: (label, batch, seq) triples; ``hidden``, ``intermediate``: the model's FFN sizes;
    the slices: ``fractions`` of the rows, or ``n_rows`` row counts."""
    for label, batch, seq in shapes:
        T = batch * seq
        for layer, (K, D) in {
            "intermediate": (intermediate, hidden),
            "output": (hidden, intermediate),
        }.items():
            torch.manual_seed(0)
            dy = torch.randn(T, K, device=device(), dtype=dtype)
            w = (torch.randn(K, D, device=device(), dtype=dtype) / K**0.5).to(dtype)
            for fraction, n in slices(T, fractions, n_rows):
                for variant in KERNEL_VARIANTS:
                    cols = {"part": "kernel", "layer": layer, "fraction": fraction, "n_rows": n, "rows": T,
                            "batch": batch, "seq": seq, "k": K, "d": D}  # fmt: skip
                    yield Cell(variant, label, dtype_name(dtype), _kernel_run(variant, dy, w, n), cols)


def _slice_and_zeros(dy, w, n: int):
    """The output ``fixed_slice_matmul`` makes, made by torch: zero the rows past the slice, then
    cuBLAS writes the slice's product in place."""
    dx = torch.empty(dy.shape[0], w.shape[1], device=dy.device, dtype=dy.dtype)
    dx[n:].zero_()
    torch.mm(dy[:n], w, out=dx[:n])
    return dx


def _kernel_run(variant: str, dy, w, n: int):
    def run() -> dict:
        record = ConfigRecord()
        fn = {
            "ours": lambda: fixed_slice_matmul(dy, w, n, record=record),
            "ours-pointer": lambda: fixed_slice_matmul(dy, w, n, impl="pointer", record=record),
            "cublas-slice": lambda: dy[:n] @ w,
            "cublas-slice-zeros": lambda: _slice_and_zeros(dy, w, n),
            "cublas-full": lambda: dy @ w,
        }[variant]
        out = fn()
        if variant.startswith("ours") or variant == "cublas-slice-zeros":
            assert (out[n:] == 0).all(), "rows past n_rows are not zero"
        if n and variant != "cublas-full":
            ref = dy[:n].float() @ w.float()
            check_close("dx", rel_err(out[:n], ref), TOL[dy.dtype])
        flops = 2 * (dy.shape[0] if variant == "cublas-full" else n) * w.shape[0] * w.shape[1]
        # The GPU's time for each call: a head start queues it behind a GPU sleep, so a host slower
        # than the kernel (a Python launch against a 30 µs GEMM) cannot leak into the interval.
        # What the call costs the host is its own column.
        row = timed(fn, flops=flops, head_start_ms=KERNEL_HEAD_START_MS if ON_GPU else 0.0, **bench_kw())
        row["host_ms"], row["device_ms"] = host_and_device_ms(fn)
        if variant.startswith("ours"):
            row["tiles"] = record.picked.get("fixed_slice_matmul", "")
        return row

    return run


def model_cells(
    original,
    about: dict,
    tokenizer: Tokenizer,
    samples: list[Sample],
    shapes,
    fractions,
    dtype,
    layers,
    n_rows=None,
) -> Iterator[Cell]:
    """``original`` and ``sliced`` cells per task and shape; ``about``: columns naming the model
    (``model``, ``weights``); ``layers``: the encoder layers to replace (None: all); the slices as
    for :func:`kernel_cells`."""
    for sample in samples:
        for label, batch, seq in shapes:
            T = batch * seq
            inputs = encode(tokenizer, sample, batch, seq, device())
            base = {"part": "model", **about, "task": sample.task, "data": sample.data,
                    "tokenizer": tokenizer.name, "rows": T, "batch": batch, "seq": seq,
                    "layers": "all" if layers is None else " ".join(map(str, layers)),
                    "n_layers": original.config.num_hidden_layers if layers is None else len(set(layers))}  # fmt: skip
            yield Cell("original", label, dtype_name(dtype), _model_run(original, None, inputs),
                       {**base, "fraction": 1.0, "n_rows": T})  # fmt: skip
            for fraction, n in slices(T, fractions, n_rows):
                yield Cell("sliced", label, dtype_name(dtype), _model_run(original, (n, layers), inputs),
                           {**base, "fraction": fraction, "n_rows": n})  # fmt: skip


def _model_run(original, sliced, inputs):
    def run() -> dict:
        model = original
        if sliced is not None:
            model = replace_ffn(copy.deepcopy(original), sliced[0], layers=sliced[1])
            # Dropout off for the comparison: it draws different masks in the two models.
            original.eval(), model.eval()
            with torch.no_grad():
                same = torch.equal(original(**inputs).logits, model(**inputs).logits)
            original.train(), model.train()
            assert same, "the replaced model's forward differs from the original's"

        def fwd():
            return model(**inputs).loss

        def fwd_bwd():
            model.zero_grad(set_to_none=True)
            fwd().backward()

        row = timed(fwd, prefix="fwd_", **bench_kw())
        row.update(timed(fwd_bwd, prefix="fwd_bwd_", **bench_kw()))
        row["bwd_ms"] = row["fwd_bwd_ms"] - row["fwd_ms"]
        if ON_GPU:
            row.update(_graphed_times(model, fwd))
        return row

    return run


def _graphed_times(model, fwd) -> dict:
    """The GPU's time for the forward and for forward+backward, each replayed from a CUDA graph behind
    a GPU sleep: the eager model is bound by the host (``fwd_ms`` is mostly Python), which hides what
    the sliced kernel saves. A model that cannot be captured gets its error in ``graph_error``."""

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        loss = fwd()
        loss.backward()
        return (loss,)

    try:
        row = timed(graph_replay(lambda: (fwd(),)), prefix="graph_fwd_", head_start_ms=1.0)
        row.update(timed(graph_replay(fwd_bwd), prefix="graph_fwd_bwd_", head_start_ms=1.0))
    except RuntimeError as err:
        return {"graph_error": str(err).splitlines()[0][:200]}
    finally:
        model.zero_grad(set_to_none=True)  # the grads live in the graph's pool
    row["graph_bwd_ms"] = row["graph_fwd_bwd_ms"] - row["graph_fwd_ms"]
    return row


# --- the profiler table ---------------------------------------------------------------------------


def profile_rows(model, inputs: dict, top: int = PROFILE_TOP) -> list[dict]:
    """The ``top`` operations of one backward of ``model`` on ``inputs`` by self time (after two
    warm-up steps; the forward runs outside the profiler): CUDA kernels by CUDA time on a GPU, CPU
    operators by CPU time on the CPU. Columns: ``rank``, ``name``, ``calls``, ``self_ms``, ``share``
    (of all the listed kind's self time in that backward) and ``clock`` ("cuda" or "cpu")."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        model.zero_grad(set_to_none=True)
        model(**inputs).loss.backward()
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ON_GPU else [])
    # One cycle: acc_events changes nothing but torch's warning that events are cleared between cycles.
    with profile(activities=activities, acc_events=True) as prof:
        loss.backward()
        if ON_GPU:
            torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    if ON_GPU:
        events = cuda_kernel_events(prof.key_averages())
        self_us = {id(e): e.self_device_time_total for e in events}
    else:
        events = [e for e in prof.key_averages() if e.device_type == DeviceType.CPU]
        self_us = {id(e): e.self_cpu_time_total for e in events}
    total = sum(self_us.values()) or 1.0
    ranked = sorted(events, key=lambda e: self_us[id(e)], reverse=True)[:top]
    clock = "cuda" if ON_GPU else "cpu"
    return [
        {
            "part": "profile",
            "rank": i + 1,
            "name": e.key,
            "calls": e.count,
            "self_ms": self_us[id(e)] / 1e3,
            "share": self_us[id(e)] / total,
            "clock": clock,
        }  # fmt: skip
        for i, e in enumerate(ranked)
    ]
