"""Render ``reports/<phase>.md`` from that phase's CSVs, and ``reports/README.md`` as the index.

``python -m common.report`` (``just report``) re-renders every phase that has data. A phase may
ship ``phases/<phase>/report.py`` with ``render(df, fig) -> str`` returning the markdown body; it
builds on the helpers here. A phase without one gets a plain table of its rows.

Only CSVs are read: a report never shows a number that is not in ``reports/data``.
"""

import argparse
import importlib.util
import os
import re
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .provenance import REPO_ROOT  # noqa: E402
from .results import data_dir  # noqa: E402

CPU_GPU_LABEL = "cpu (TRITON_INTERPRET=1)"


def reports_dir() -> Path:
    """Reports sit beside their data: ``reports/`` for ``reports/data``, a temporary dir in tests."""
    return data_dir().parent


def write_atomically(path: Path, write) -> None:
    """``write(tmp_path)`` then rename over ``path``: concurrent renders (job-array tasks) and readers
    only ever see a whole file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)


def load_phase(phase: str, subdir: str = "") -> pd.DataFrame:
    """Every row ever written for ``phase`` (or its ``subdir``, as profiles are), across all its CSVs."""
    # Provenance columns are text even where they look like numbers ("13.0", a hex commit).
    text = {
        c: str
        for c in [
            "gpu",
            "torch",
            "triton",
            "cuda",
            "cudnn",
            "git_commit",
            "git_dirty",
            "host",
            "run_id",
            "run_group",
            "slurm_job_id",
            "slurm_array_job_id",
            "slurm_array_task_id",
        ]
    }
    frames = [
        pd.read_csv(p, dtype=text, keep_default_na=False, na_values=[""])
        for p in sorted((data_dir() / phase / subdir).glob("*.csv"))
    ]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    for col in ("variant", "shape", "dtype", "status", "error"):
        if col in df:
            df[col] = df[col].astype(object).where(df[col].notna(), "").astype(str)
    return df


def select_latest(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """For every GPU and cell (``keys``), keep the rows of the newest run group that measured it."""
    if df.empty:
        return df
    cell = ["gpu", *keys]
    newest = df.groupby(cell, dropna=False)["utc"].transform("max")
    group_of_newest = df.loc[df["utc"] == newest].groupby(cell, dropna=False)["run_group"].first()
    keep = df.join(group_of_newest.rename("_newest_group"), on=cell)
    return keep.loc[keep["run_group"] == keep["_newest_group"]].drop(columns="_newest_group")


def add_speedup(
    df: pd.DataFrame, keys: list[str], baseline: str, metric: str = "ms", column: str | None = None
) -> pd.DataFrame:
    """Add ``column`` = baseline's ``metric`` / this row's ``metric``, matched on ``keys`` within the
    same run group, so a speedup always compares numbers measured side by side."""
    column = column or f"speedup_vs_{baseline}"
    on = ["run_group", "gpu", *keys]
    base = df.loc[(df["variant"] == baseline) & (df["status"] == "ok"), [*on, metric]]
    base = base.drop_duplicates(on).rename(columns={metric: "_base"})
    out = df.merge(base, on=on, how="left")
    out[column] = out["_base"] / out[metric]
    return out.drop(columns="_base")


def format_number(x) -> str:
    """Readable figures: thousands separators for large values, four significant digits otherwise."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or pd.isna(x):
        return "" if x is None or (isinstance(x, float) and pd.isna(x)) else str(x)
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def markdown_table(df: pd.DataFrame, columns: list[str] | None = None) -> str:
    if df.empty:
        return "_no rows_\n"
    view = (df[columns] if columns else df).copy()
    for col in view.columns:
        if pd.api.types.is_numeric_dtype(view[col]) and not pd.api.types.is_bool_dtype(view[col]):
            view[col] = view[col].map(format_number)
        else:  # a cell a row does not have is blank, not "nan"
            view[col] = view[col].astype(object).where(view[col].notna(), "")
    return view.to_markdown(index=False, disable_numparse=True) + "\n"


class Figures:
    """Saves matplotlib figures next to a phase's report and returns their markdown links."""

    def __init__(self, phase: str, root: Path):
        self.phase = phase
        self.root = root
        (root / "figures").mkdir(parents=True, exist_ok=True)

    def line_plot(
        self,
        df: pd.DataFrame,
        *,
        x: str,
        y: str,
        series: str,
        name: str,
        title: str,
        xlabel: str | None = None,
        ylabel: str | None = None,
        logx: bool = False,
        logy: bool = False,
    ) -> str:
        """One line per value of ``series``; returns ``![title](figures/...)``."""
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for label, part in df.sort_values(x).groupby(series):
            ax.plot(part[x], part[y], marker="o", label=str(label))
        ax.set(title=title, xlabel=xlabel or x, ylabel=ylabel or y)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.phase}_{name}")
        path = self.root / "figures" / f"{slug}.png"
        write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
        plt.close(fig)
        return f"![{title}](figures/{path.name})\n"


def provenance_table(df: pd.DataFrame) -> str:
    """One line per run group: where and with what the rows were measured."""
    cols = ["gpu", "sm_count", "torch", "triton", "cuda", "cudnn", "git_commit", "git_dirty", "host"]
    cols = [c for c in cols if c in df]
    runs = df.groupby("run_group", dropna=False).agg({**{c: "first" for c in cols}, "utc": "max"})
    runs = runs.reset_index().sort_values("utc")
    return markdown_table(runs, ["run_group", "utc", *cols])


def failures_table(df: pd.DataFrame) -> str:
    failed = df.loc[df["status"] != "ok"]
    if failed.empty:
        return ""
    cols = [c for c in ["gpu", "variant", "shape", "dtype", "status", "error"] if c in failed]
    return "\n### Cells that did not finish\n\n" + markdown_table(failed, cols)


def default_render(df: pd.DataFrame, fig: Figures) -> str:
    metric_cols = [c for c in df.columns if c.endswith("ms") or c.endswith("_gb") or c.endswith("per_s")]
    cols = ["gpu", "variant", "shape", "dtype", *metric_cols]
    return markdown_table(df.loc[df["status"] == "ok"], [c for c in cols if c in df]) + failures_table(df)


def _phase_renderer(phase: str) -> Callable[[pd.DataFrame, Figures], str]:
    path = REPO_ROOT / "phases" / phase / "report.py"
    if not path.exists():
        return default_render
    spec = importlib.util.spec_from_file_location(f"_report_{phase}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render


def _title(phase: str) -> str:
    readme = REPO_ROOT / "phases" / phase / "README.md"
    if readme.exists():
        first = readme.read_text().splitlines()[0]
        return first.lstrip("# ").strip()
    return phase


def render_phase(phase: str, out_dir: Path | None = None) -> Path | None:
    """Write ``reports/<phase>.md`` from the phase's CSVs; returns its path (None without data).

    GPU runs come first; rows from CPU runs (the interpreter) are shown last and marked as smoke
    runs, since their times check that the code runs and measure nothing.
    """
    out_dir = out_dir or reports_dir()
    df = load_phase(phase)
    if df.empty:
        return None
    render = _phase_renderer(phase)
    on_gpu = df.loc[df["gpu"] != CPU_GPU_LABEL]
    on_cpu = df.loc[df["gpu"] == CPU_GPU_LABEL]
    parts = [
        f"# {_title(phase)}\n",
        f"_Generated by `just report` from `reports/data/{phase}/*.csv`; do not edit by hand._\n",
    ]
    # Rows of different GPU models are never compared: each gets its own section, newest first.
    gpus = on_gpu.groupby("gpu")["utc"].max().sort_values(ascending=False).index
    for i, gpu in enumerate(gpus):
        if len(gpus) > 1:
            parts.append(f"## On the {gpu}\n")
        # The newest GPU's figures keep the plain names the READMEs link; older GPUs' get a suffix.
        slug = phase if i == 0 else f"{phase}_{re.sub(r'[^a-z0-9]+', '_', gpu.lower()).strip('_')}"
        parts.append(render(on_gpu.loc[on_gpu["gpu"] == gpu], Figures(slug, out_dir)))
    if len(gpus):
        parts += ["\n## Runs\n\n", provenance_table(on_gpu)]
    else:
        parts.append("No GPU rows yet: run this phase on a CUDA machine.\n")
    if not on_cpu.empty:
        cpu_fig = Figures(f"{phase}_cpu", out_dir)
        parts += ["\n## CPU smoke runs (Triton interpreter; not measurements)\n\n", render(on_cpu, cpu_fig)]
    path = out_dir / f"{phase}.md"
    write_atomically(path, lambda tmp: tmp.write_text("\n".join(parts)))
    return path


def render_all(out_dir: Path | None = None) -> list[Path]:
    out_dir = out_dir or reports_dir()
    phases = sorted(p.name for p in data_dir().iterdir() if p.is_dir()) if data_dir().exists() else []
    written = [p for p in (render_phase(ph, out_dir) for ph in phases) if p is not None]
    write_index(out_dir, phases)
    return written


def write_index(out_dir: Path, phases_with_data: list[str]) -> Path:
    rows = []
    for phase_dir in sorted((REPO_ROOT / "phases").iterdir()):
        if not (phase_dir / "__init__.py").exists():
            continue
        name = phase_dir.name
        what = _title(name).removeprefix(name).lstrip(" —·:-")
        if name in phases_with_data:
            df = load_phase(name)
            gpus = ", ".join(sorted(g for g in df["gpu"].unique() if g != CPU_GPU_LABEL)) or "CPU only"
            rows.append(f"| [{name}]({name}.md) | {what} | {gpus} | {df['utc'].max()} |")
        else:
            rows.append(f"| {name} | {what} | no data yet | |")
    text = (
        "# Reports\n\n_Generated by `just report`; every number comes from `reports/data/`._\n\n"
        "| phase | what | measured on | last row (UTC) |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    path = out_dir / "README.md"
    write_atomically(path, lambda tmp: tmp.write_text(text))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phases", nargs="*", help="phase directories to render (default: all with data)")
    args = parser.parse_args()
    if args.phases:
        for phase in args.phases:
            print(render_phase(phase) or f"{phase}: no data")
        write_index(reports_dir(), sorted(p.name for p in data_dir().iterdir() if p.is_dir()))
    else:
        for path in render_all():
            print(path)


if __name__ == "__main__":
    main()
