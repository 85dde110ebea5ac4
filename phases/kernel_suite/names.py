"""The suite's kernels by name, in the order the command line and the report list them: apart from
``bench.py`` so that the report, which renders from CSVs, imports no kernel."""

KERNELS = (
    "rms_norm",
    "gelu",
    "swiglu",
    "geglu",
    "rope",
    "cross_entropy",
    "cross_entropy_options",
    "fused_linear_cross_entropy",
    "fp8_row",
    "fp8_block",
)
