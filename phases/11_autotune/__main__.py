"""Phase 11 -- tuned configs per GPU and dtype: tuned once, kept in tables, looked up, checked for the A100.

    python -m phases 11                                   # on a GPU: tune, write tables, compare, startup
    python -m phases 11 --tasks tune                      # only tune and write the tables
    python -m phases 11 --functions attention --shape mid --repeats 3
    python -m phases 11 --tasks tune --shape sweep-Lk1000 sweep-Lk30000   # 02-04's sweep (attention)
    python -m phases 11                                   # without a GPU: the interpreter smoke and the
                                                          # sm_80 compile check (rows to out/cpu)

On a GPU (``bench.py``): each public function with an autotuned kernel (``tritonlab.tuning_workloads``)
at each shape is tuned over its full search space in this process, and the picks are written to
``tritonlab/tables/<gpu>_bf16.json`` (``--tables`` for another directory; on an H100 also
``a100_bf16.json``, from the H100's times restricted to the configs that compile for sm_80 without
spills). Then fresh processes compare the table's pick with fresh full tunes and with the untuned
default, and time the TransformerNP's first training step with and without the table.

Without a GPU: every function runs once at the tiny shape in Triton's interpreter, and the sm_80
compile check (``sm80.py``) compiles every config an A100 table could hold at ``--sm80-shapes``
(compile-only: the model's shapes are fine here). The committed results are refreshed with
``python -m phases.11_autotune.sm80``.
"""

from pathlib import Path

from common import ON_GPU, run_cells
from common.cli import choices_argument, parse_phase_args, phase_parser, phase_run
from tritonlab import tuning_tables, tuning_workloads

from .bench import (
    compare_cells,
    flash2_tune_cell,
    sm80_cell,
    smoke_cell,
    startup_cell,
    tune_cell,
    write_tables,
)
from .report import REPORT

PHASE = "11_autotune"
TASKS = ("tune", "compare", "startup")


def parse_args(argv=None):
    parser = phase_parser(
        PHASE,
        __doc__.strip().splitlines()[0],
        shapes=("tiny", *tuning_workloads.TNP_SHAPES, *tuning_workloads.SWEEP_SHAPES),
        gpu_shapes=tuning_workloads.TNP_SHAPES,
    )
    choices_argument(parser, "--tasks", list(TASKS), "TASK", what="GPU tasks, in this order")
    choices_argument(
        parser, "--functions", list(tuning_workloads.FUNCTIONS), "FN", what="public functions tuned"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="fresh full tunes per compare cell (default: 5)"
    )
    parser.add_argument(
        "--startup-shape", nargs="+", default=["mid"], choices=tuning_workloads.TNP_SHAPES,
        help="TNP shapes of the first-step measurement (default: mid)",
    )  # fmt: skip
    parser.add_argument(
        "--tables", type=Path, default=tuning_tables.TABLE_DIR,
        help="directory the tables are written to and read from (default: the package's tritonlab/tables)",
    )  # fmt: skip
    parser.add_argument(
        "--sm80-shapes", nargs="+", default=["small"], choices=tuning_workloads.TNP_SHAPES,
        help="CPU: shapes of the sm_80 compile check (compile only; default: small; the committed results cover small mid large)",
    )  # fmt: skip
    parser.add_argument(
        "--no-flash2", action="store_true", help="tune: leave FlashAttention-2's tiles out of the tables"
    )
    args = parse_phase_args(parser, argv)
    if args.repeats < 1:
        parser.error("--repeats: must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    with phase_run(PHASE, REPORT, no_report=args.no_report) as writer:
        if not ON_GPU:
            run_cells(writer, [smoke_cell(fn) for fn in args.functions])
            out = writer.path.parent / "sm80_compile.json"
            run_cells(writer, [sm80_cell(args.sm80_shapes, out)])
            return
        work = tuning_workloads.workloads(args.shape, functions=args.functions)
        if "tune" in args.tasks:
            tuned: list = []
            cells = [tune_cell(w, tuned) for w in work]
            if not args.no_flash2:
                cells += [flash2_tune_cell(shape, tuned) for shape in tuning_workloads.FLASH2_SHAPES]
            run_cells(writer, cells)
            for path in write_tables(tuned, args.tables):
                print(f"table: {path}")
        if "compare" in args.tasks:
            run_cells(writer, [cell for w in work for cell in compare_cells(w, args.tables, args.repeats)])
        if "startup" in args.tasks:
            run_cells(writer, [startup_cell(s, args.tables) for s in args.startup_shape])


if __name__ == "__main__":
    main()
