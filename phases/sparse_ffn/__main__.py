"""Phase sparse_ffn -- a fixed-slice FFN backward (numerically WRONG for training) in BERT/RoBERTa.

    python -m phases sparse_ffn                           # or: just phase sparse_ffn
    python -m phases sparse_ffn --shape 32x512 --parts kernel --fractions 0 0.5 1
    python -m phases sparse_ffn --model roberta-base --task sst2 mrpc --layers 0 11 --profile
    python -m phases sparse_ffn --model /path/to/bert --data-dir /path/to/glue --batch 16 --seq-len 256

THE SLICED BACKWARD IS NUMERICALLY WRONG FOR TRAINING: dX of the FFN layers keeps the first N rows of
the flattened (batch·seq) dY only, a truncation by position, not importance. The phase measures what
such a kernel could buy: ``tritonlab.sparse_ffn.fixed_slice_matmul`` alone against torch.matmul on
the same slice and on the full dY, and forward/backward latency of a BERT or RoBERTa sequence
classifier fed GLUE rows (local, or a generated sample) with its FFN layers replaced, across N; with
``--profile``, the original model's backward by kernel. Nothing is downloaded. Without a GPU: a
tiny model in Triton's interpreter.
"""

from common import ON_GPU, run_cells
from common.cli import (
    choices_argument,
    parse_phase_args,
    phase_parser,
    phase_run,
    refuse_bf16_on_cpu,
    require_at_least,
)
from common.results import failure_row
from tritonlab.testing import DTYPES

from .bench import (
    CPU_MAX_ROWS,
    FRACTIONS,
    GPU_SHAPES,
    KERNEL_VARIANTS,
    MODELS,
    PARTS,
    SHAPES,
    build_model,
    kernel_cells,
    model_cells,
    profile_rows,
    resolve_model,
)
from .data import TASKS, check_task, encode, load_sample, load_tokenizer, model_tokenizer, train_tokenizer
from .report import REPORT

PHASE = "sparse_ffn"
WARNING = (
    "WARNING: sparse_ffn's backward is numerically WRONG for training (dX truncated to the first N "
    "rows of dY by position); this phase only measures what such a kernel could buy."
)


def make_parser():
    parser = phase_parser(
        PHASE,
        __doc__.strip().splitlines()[0],
        shapes=list(SHAPES),
        gpu_shapes=GPU_SHAPES,
        cpu_shapes=("tiny",),
        dtypes=("bf16", "fp16", "fp32"),
        default_dtype="bf16" if ON_GPU else "fp32",
        epilog="shapes (--shape): batch x sequence length; tiny = 2 x 8 with a tiny model (the interpreter's)",
    )
    parser.add_argument(
        "--batch", type=int, default=None, help="batch size for every --shape (default: the shape's)"
    )
    parser.add_argument(
        "--seq-len", type=int, default=None, help="sequence length for every --shape (default: the shape's)"
    )
    parser.add_argument(
        "--model", default="bert-base-uncased", metavar="NAME",
        help=f"a BERT or RoBERTa model: a local directory or a name in the Hugging Face cache (its weights "
        f"are used where present), else one of {', '.join(MODELS)} built from its config with random "
        "weights (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--task", nargs="+", default=["sst2"], metavar="TASK",
        help=f"GLUE task(s) whose rows feed the model, any of {', '.join(TASKS)} (default: sst2)",
    )  # fmt: skip
    data = parser.add_mutually_exclusive_group()
    data.add_argument(
        "--data-dir", default=None, metavar="DIR",
        help="a local copy of the nyu-mll/glue dataset repository (DIR/<task>/validation-*.parquet); "
        "default: the Hugging Face cache where it has the task, else a generated sample",
    )  # fmt: skip
    data.add_argument(
        "--generated", action="store_true",
        help="a generated GLUE-like sample and a tokenizer trained on it, whatever is cached locally",
    )  # fmt: skip
    parser.add_argument(
        "--tokenizer", default=None, metavar="PATH",
        help="a local tokenizer (directory or cached name); default: the model's own where it is local, "
        "else one trained on the rows' text",
    )  # fmt: skip
    slices = parser.add_mutually_exclusive_group()
    slices.add_argument(
        "--fractions", nargs="+", type=float, default=list(FRACTIONS), metavar="F",
        help="N as fractions of batch*seq rows, each in [0, 1] (default: %(default)s)",
    )  # fmt: skip
    slices.add_argument(
        "--n-rows", nargs="+", type=int, default=None, metavar="N",
        help="N as row counts, each in [0, batch*seq] of every shape (instead of --fractions)",
    )  # fmt: skip
    parser.add_argument(
        "--layers", nargs="+", type=int, default=None, metavar="I",
        help="encoder layer indices to replace (default: all)",
    )  # fmt: skip
    choices_argument(parser, "--parts", PARTS, "PART")
    parser.add_argument(
        "--profile", action="store_true",
        help="add a torch.profiler table of the original model's backward (top kernels by CUDA time; "
        "CPU operators by CPU time without a GPU)",
    )  # fmt: skip
    return parser


def parse_args(argv=None, parser=None):
    parser = parser or make_parser()
    args = parse_phase_args(parser, argv)
    refuse_bf16_on_cpu(parser, args.dtype)
    require_at_least(parser, args, {"batch": 1, "seq_len": 4})  # 4: a pair's special tokens
    if args.generated and args.tokenizer:
        parser.error("--tokenizer: not with --generated (which trains its own tokenizer)")
    bad = [f for f in args.fractions if not 0.0 <= f <= 1.0]
    if bad:
        parser.error(f"--fractions: each must be in [0, 1], got {bad}")
    try:
        for task in args.task:
            check_task(task)
    except ValueError as err:
        parser.error(str(err))
    args.task = list(dict.fromkeys(args.task))
    args.shapes = []
    for name in args.shape:
        batch, seq = SHAPES[name]
        batch, seq = args.batch or batch, args.seq_len or seq
        label = name if (batch, seq) == SHAPES[name] else f"{batch}x{seq}"
        if not ON_GPU and batch * seq > CPU_MAX_ROWS:
            parser.error(
                f"--batch/--seq-len: {batch} x {seq} rows are too many for Triton's interpreter on the "
                f"CPU (at most {CPU_MAX_ROWS}); run that on a GPU"
            )
        args.shapes.append((label, batch, seq))
    rows = min(batch * seq for _, batch, seq in args.shapes)
    bad = [n for n in args.n_rows or [] if not 0 <= n <= rows]
    if bad:
        parser.error(
            f"--n-rows: each must be in [0, {rows}] (the fewest batch*seq rows of the shapes), got {bad}"
        )
    return args


def prepare(args) -> dict:
    """The model's config, and where the model part or the profile needs them, the rows, the
    tokenizer and the model. Raises ValueError naming the flag at fault."""
    spec = resolve_model(args.model)
    longest = max(seq for _, _, seq in args.shapes)
    if longest > spec.max_seq:
        raise ValueError(
            f"--shape/--seq-len: a sequence of {longest} is longer than {args.model}'s {spec.max_seq} positions"
            + (" (the CPU's tiny config)" if spec.tiny else "")
        )
    count = spec.config.num_hidden_layers
    for i in args.layers or []:
        if not 0 <= i < count:
            raise ValueError(
                f"--layers: index {i} is out of range for a model of {count} layers"
                + (" (the CPU's tiny config)" if spec.tiny else "")
            )
    setup = {"spec": spec}
    if "model" in args.parts or args.profile:
        rows = max(batch for _, batch, _ in args.shapes)
        samples = [load_sample(t, rows, args.data_dir, args.generated) for t in args.task]
        if args.tokenizer:
            tokenizer = load_tokenizer(args.tokenizer)
        else:
            local = None if args.generated else model_tokenizer(args.model)
            tokenizer = local or train_tokenizer(spec.family, [t for s in samples for t in s.texts()])
        model, weights = build_model(spec, tokenizer, DTYPES[args.dtype])
        setup.update(samples=samples, tokenizer=tokenizer, model=model, weights=weights)
    return setup


def write_profile(writer, args, setup) -> None:
    """The profile rows of the original model's backward at every shape, on the first task's rows."""
    sample, tokenizer, model = setup["samples"][0], setup["tokenizer"], setup["model"]
    for label, batch, seq in args.shapes:
        key = {"variant": "original", "shape": label, "dtype": args.dtype, "part": "profile",
               "model": args.model, "weights": setup["weights"], "task": sample.task, "data": sample.data,
               "tokenizer": tokenizer.name, "batch": batch, "seq": seq}  # fmt: skip
        try:
            rows = profile_rows(model, encode(tokenizer, sample, batch, seq, model.device))
        except Exception as err:  # like a failed cell: a row, and the run goes on
            writer.write({**key, **failure_row(err)})
            continue
        for row in rows:
            writer.write({**key, **row})
        print(f"  profile {label}: top {len(rows)} by {rows[0]['clock'] if rows else ''} time written")


def main(argv=None) -> None:
    print(WARNING)
    parser = make_parser()
    args = parse_args(argv, parser)
    try:
        setup = prepare(args)
    except ValueError as err:
        parser.error(str(err))
    dtype = DTYPES[args.dtype]
    spec = setup["spec"]
    config = spec.config
    sizes = f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, FFN {config.intermediate_size}"
    weights = f", {setup['weights']}" if "weights" in setup else ""
    print(f"model: {args.model} ({spec.family}, {sizes}){weights}")
    for sample in setup.get("samples", []):
        print(f"data: {sample.data}; tokenizer: {setup['tokenizer'].name}")

    def cells():
        if "kernel" in args.parts:
            yield from kernel_cells(
                args.shapes, args.fractions, dtype, config.hidden_size, config.intermediate_size, args.n_rows
            )
        if "model" in args.parts:
            about = {"model": args.model, "weights": setup["weights"]}
            yield from model_cells(
                setup["model"], about, setup["tokenizer"], setup["samples"], args.shapes, args.fractions,
                dtype, args.layers, args.n_rows,
            )  # fmt: skip

    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        n_slices = len(args.n_rows or args.fractions)
        per_shape = 2 * len(KERNEL_VARIANTS) * n_slices if "kernel" in args.parts else 0
        per_shape += len(args.task) * (1 + n_slices) if "model" in args.parts else 0
        run_cells(writer, cells(), total=len(args.shapes) * per_shape)
        if args.profile:
            write_profile(writer, args, setup)


if __name__ == "__main__":
    main()
