"""Phase sparse_ffn's cells. The sliced backward is numerically WRONG for training: a measurement only.

- kernel cells (``part`` = "kernel"): the two dX GEMMs of a BERT FFN layer at T = batch·seq rows,
  ``intermediate`` (dY (T, 3072) @ W (3072, 768)) and ``output`` (dY (T, 768) @ W (768, 3072)), for
  N = fraction·T rows: ``ours`` (``fixed_slice_matmul``: the slice plus the zero rows, one launch),
  ``cublas-slice`` (``torch.matmul`` on dy[:N], no zero rows written) and ``cublas-full`` (on all of
  dY: what the unmodified backward does). Checked against the float32 product of the slice first.
- model cells (``part`` = "model"): a bert-base- or roberta-base-sized model built from its config
  with random weights (or ``--weights`` from a local path), random token ids (timing depends on batch
  and sequence length only), ``original`` and ``sliced`` (``replace_ffn`` with N rows) forward and
  forward+backward ms; backward = the difference. Forward outputs are checked identical first.
On the CPU: tiny dims in Triton's interpreter (nothing is measured).
"""

import copy
from collections.abc import Iterator

import torch

from common import ON_GPU, Cell, check_close, timed
from tritonlab.sparse_ffn import fixed_slice_matmul, replace_ffn
from tritonlab.testing import dtype_name, rel_err
from tritonlab.tuning import ConfigRecord

# (batch, sequence) per --shape; on the CPU only the tiny one runs.
SHAPES = {"tiny": (2, 8), "32x128": (32, 128), "32x512": (32, 512), "8x512": (8, 512)}
GPU_SHAPES = ("32x128", "32x512", "8x512")
FRACTIONS = (0.0, 0.125, 0.25, 0.5, 1.0)
MODELS = ("bert", "roberta")
PARTS = ("kernel", "model")
KERNEL_VARIANTS = ("ours", "cublas-slice", "cublas-full")
HIDDEN, INTERMEDIATE = (768, 3072) if ON_GPU else (32, 48)
TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def device() -> str:
    return "cuda" if ON_GPU else "cpu"


def bench_kw() -> dict:
    return {} if ON_GPU else {"warmup_ms": 1.0, "rep_ms": 1.0, "min_reps": 1}


def n_rows_of(fraction: float, rows: int) -> int:
    return int(round(fraction * rows))


def kernel_cells(shapes, fractions, dtype: torch.dtype) -> Iterator[Cell]:
    for shape in shapes:
        batch, seq = SHAPES[shape]
        T = batch * seq
        for layer, (K, D) in {
            "intermediate": (INTERMEDIATE, HIDDEN),
            "output": (HIDDEN, INTERMEDIATE),
        }.items():
            torch.manual_seed(0)
            dy = torch.randn(T, K, device=device(), dtype=dtype)
            w = (torch.randn(K, D, device=device(), dtype=dtype) / K**0.5).to(dtype)
            for fraction in fractions:
                n = n_rows_of(fraction, T)
                for variant in KERNEL_VARIANTS:
                    cols = {"part": "kernel", "layer": layer, "fraction": fraction, "n_rows": n, "rows": T,
                            "k": K, "d": D}  # fmt: skip
                    yield Cell(variant, shape, dtype_name(dtype), _kernel_run(variant, dy, w, n), cols)


def _kernel_run(variant: str, dy, w, n: int):
    def run() -> dict:
        record = ConfigRecord()
        fn = {
            "ours": lambda: fixed_slice_matmul(dy, w, n, record=record),
            "cublas-slice": lambda: dy[:n] @ w,
            "cublas-full": lambda: dy @ w,
        }[variant]
        out = fn()
        if variant == "ours":
            assert (out[n:] == 0).all(), "rows past n_rows are not zero"
        if n and variant != "cublas-full":
            ref = dy[:n].float() @ w.float()
            check_close("dx", rel_err(out[:n], ref), TOL[dy.dtype])
        flops = 2 * (dy.shape[0] if variant == "cublas-full" else n) * w.shape[0] * w.shape[1]
        row = timed(fn, flops=flops, **bench_kw())
        if variant == "ours":
            row["tiles"] = record.picked.get("fixed_slice_matmul", "")
        return row

    return run


def build_model(kind: str, dtype: torch.dtype, weights: str | None):
    """A bert-base/roberta-base-sized encoder from its config with random weights (tiny on the CPU);
    ``weights``: a local directory for ``from_pretrained`` (never the network)."""
    import transformers

    cls = {"bert": transformers.BertModel, "roberta": transformers.RobertaModel}[kind]
    if weights:
        model = cls.from_pretrained(weights, local_files_only=True)
    else:
        config_cls = {"bert": transformers.BertConfig, "roberta": transformers.RobertaConfig}[kind]
        sizes = {} if ON_GPU else {"vocab_size": 99, "hidden_size": HIDDEN, "num_hidden_layers": 2,
                                   "num_attention_heads": 2, "intermediate_size": INTERMEDIATE}  # fmt: skip
        if kind == "roberta" and not ON_GPU:
            sizes["max_position_embeddings"] = 64
        torch.manual_seed(0)
        model = cls(config_cls(**sizes))
    return model.to(device=device(), dtype=dtype).train()


def model_cells(kind, shapes, fractions, dtype, layers, weights) -> Iterator[Cell]:
    original = build_model(kind, dtype, weights)
    for shape in shapes:
        batch, seq = SHAPES[shape]
        T = batch * seq
        g = torch.Generator(device()).manual_seed(0)
        ids = torch.randint(5, original.config.vocab_size, (batch, seq), generator=g, device=device())
        grad = torch.randn(batch, seq, original.config.hidden_size, device=device(), dtype=dtype)
        base = {"part": "model", "model": kind, "rows": T, "batch": batch, "seq": seq,
                "layers": "all" if layers is None else " ".join(map(str, layers)),
                "n_layers": original.config.num_hidden_layers if layers is None else len(set(layers))}  # fmt: skip
        yield Cell("original", shape, dtype_name(dtype), _model_run(original, None, ids, grad),
                   {**base, "fraction": 1.0, "n_rows": T})  # fmt: skip
        for fraction in fractions:
            n = n_rows_of(fraction, T)
            yield Cell("sliced", shape, dtype_name(dtype), _model_run(original, (n, layers), ids, grad),
                       {**base, "fraction": fraction, "n_rows": n})  # fmt: skip


def _model_run(original, sliced, ids, grad):
    def run() -> dict:
        model = original
        if sliced is not None:
            model = replace_ffn(copy.deepcopy(original), sliced[0], layers=sliced[1])
            original.eval(), model.eval()
            with torch.no_grad():
                same = torch.equal(original(ids).last_hidden_state, model(ids).last_hidden_state)
            original.train(), model.train()
            assert same, "the replaced model's forward differs from the original's"

        def fwd():
            return model(ids).last_hidden_state

        def fwd_bwd():
            model.zero_grad(set_to_none=True)
            fwd().backward(grad)

        row = timed(fwd, prefix="fwd_", **bench_kw())
        row.update(timed(fwd_bwd, prefix="fwd_bwd_", **bench_kw()))
        row["bwd_ms"] = row["fwd_bwd_ms"] - row["fwd_ms"]
        return row

    return run
