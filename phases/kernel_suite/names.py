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
    "cross_entropy_smoothing",
    "cross_entropy_softcap",
    "cross_entropy_zloss",
    "fused_linear_cross_entropy",
    "fp8_row",
    "fp8_block",
)
# Cross-entropy's options (issue 25) at values models use (Gemma 2's softcap, PaLM's z-loss): all on
# at once, and each alone; each cell's goal is ours within 5% of our plain loss at the same size.
CE_OPTION_SETS = {
    "cross_entropy_options": {"label_smoothing": 0.1, "softcap": 30.0, "lse_square_scale": 1e-4},
    "cross_entropy_smoothing": {"label_smoothing": 0.1},
    "cross_entropy_softcap": {"softcap": 30.0},
    "cross_entropy_zloss": {"lse_square_scale": 1e-4},
}
