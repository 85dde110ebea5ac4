"""What the diagnostics that time a variant of a Gluon kernel share: the module built from the
library's source with edits, and the FP8 forward run on a module (the K/V quantisation included)."""

import importlib.util
import pathlib
import tempfile

# A module outside the package imports the library absolutely.
ABSOLUTE_IMPORTS = [
    ("from .._gluon", "from tritonlab._gluon"),
    ("from .._launch", "from tritonlab._launch"),
    ("from .._runtime", "from tritonlab._runtime"),
    ("from ..ops import", "from tritonlab.ops import"),
    ("from .forward_hopper", "from tritonlab.attention.forward_hopper"),
    ("from ._common", "from tritonlab.attention._common"),
]


def load_patched(library_file: str, name: str, edit) -> object:
    """The module of ``tritonlab/attention/<library_file>`` whose source ``edit`` (str -> str) changed,
    written to a file of its own (Gluon reads a kernel's source from its file) and imported as ``name``."""
    return load_source(f"tritonlab/attention/{library_file}", name, edit)


def load_source(path: str, name: str, edit) -> object:
    """``load_patched`` for a library module's source at any ``path`` (an older commit's, say)."""
    source = pathlib.Path(path).read_text()
    for old, new in ABSOLUTE_IMPORTS:
        source = source.replace(old, new)
    path = pathlib.Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(edit(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def replace_all(source: str, edits: list[tuple[str, str]]) -> str:
    """``source`` with each (old, new) of ``edits`` replaced, every old found."""
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    return source


def fp8_forward(module, q, k, v, **options):
    """o of ``module.forward`` (``fp8_hopper``'s signature, with ``options`` such as ``split``) at q,
    k, v, K and V quantised first."""
    from tritonlab.attention import fp8
    from tritonlab.attention._common import LOG2E
    from tritonlab.attention.forward import _forward_outputs

    k8, ks, v8t, vs, vm = fp8._quantize_kv(k, v)
    o, lse = _forward_outputs(q)
    module.forward(
        q, k8, ks, v8t, vs, vm, o, lse, q.shape[-1] ** -0.5 * LOG2E, fp8.KV_BLOCK, k.shape[2], **options
    )
    return o


def alternate(tag: str, rounds: int, reps: dict, baseline, runs: dict) -> None:
    """Print ``rounds`` rounds of do_bench medians: ``baseline`` (SDPA cuDNN), then each of ``runs``
    (label -> call) in turn, with each against the baseline and the first against the last."""
    from triton.testing import do_bench

    for r in range(rounds):
        base = do_bench(baseline, **reps)
        times = {label: do_bench(call, **reps) for label, call in runs.items()}
        parts = ", ".join(f"{label} {ms:.3f} ({base / ms:.3f}x)" for label, ms in times.items())
        (first, a), (last, b) = list(times.items())[0], list(times.items())[-1]
        print(f"{tag} round {r}: cudnn {base:.3f} ms, {parts}; {first} / {last} {a / b:.3f}", flush=True)
