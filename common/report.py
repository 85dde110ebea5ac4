"""Render ``reports/<phase>.md`` from that phase's CSVs, and ``reports/README.md`` as the index.

A phase describes its report with a :class:`PhaseReport`: its title, ``render(df, fig) -> str``
(the markdown body, built on the helpers here) and ``headline(df) -> list[Verdict]`` (the cells
that say whether the phase met its goal). ``python -m phases report`` (``just report``) hands every
phase's ``PhaseReport`` to :func:`render_all`; this module knows nothing of the phases themselves.

Only CSVs are read: a report never shows a number that is not in the data directory. Rows from the
CPU interpreter measure nothing: they are listed as "ran" or "failed", never turned into a ratio.
"""

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .device import CPU_LABEL  # noqa: E402
from .results import data_dir  # noqa: E402

CPU_GPU_LABEL = CPU_LABEL


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
        pd.read_csv(p, dtype=text, keep_default_na=False, na_values=["", "nan"])
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


def verdict_run(
    rows: pd.DataFrame, ours: list[str], baselines: list[str], metric: str, higher_is_better: bool = False
) -> str | None:
    """The run group a cell's ratio comes from, given the cell's ok rows: the newest run that measured
    one of ``ours`` beside every baseline known to be the best -- no baseline it lacks beat, in
    another run with ours, the baselines the two runs share. So a run cut short (a timeout after
    eager, before compile) does not hide the complete run before it, while a rerun of ours beside
    only the best baseline still counts. None when no run measured ours."""
    runs = rows.loc[rows["variant"].isin(ours)]
    if runs.empty:
        return None
    newest_first = runs.groupby("run_group")["utc"].max().sort_values(ascending=False).index
    best = rows.loc[rows["variant"].isin(baselines)].groupby(["run_group", "variant"])[metric].median()
    if higher_is_better:
        best = -best
    per_run = {
        g: best.xs(g) if g in best.index.get_level_values(0) else pd.Series(dtype=float) for g in newest_first
    }

    def complete(group) -> bool:
        present = set(per_run[group].index)
        if not present and any(len(times) for times in per_run.values()):
            return False
        for times in per_run.values():
            lacked = [v for v in times.index if v not in present]
            shared = [v for v in times.index if v in present]
            if lacked and shared and times[lacked].min() < times[shared].min():
                return False
        return True

    for group in newest_first:
        if complete(group):
            return group
    return max(newest_first, key=lambda g: len(per_run[g]))  # the fullest, newest among equals


def select_verdict_runs(
    df: pd.DataFrame, keys: list[str], ours: list[str], metric: str = "ms"
) -> pd.DataFrame:
    """For every GPU and cell (``keys``), the rows of the run ``verdict_run`` picks (every variant not
    in ``ours`` a baseline, by ``metric``, lower is better); the newest run where none has ok rows of
    ours."""
    if df.empty:
        return df
    parts = []
    for _, cell in df.groupby(["gpu", *keys], dropna=False, sort=False):
        cell_ok = cell.loc[cell["status"] == "ok"]
        baselines = sorted(set(cell_ok["variant"]) - set(ours))
        group = verdict_run(cell_ok, ours, baselines, metric)
        if group is None:
            group = cell.sort_values("utc")["run_group"].iloc[-1]
        parts.append(cell.loc[cell["run_group"] == group])
    return pd.concat(parts)


def ok_table(
    df: pd.DataFrame,
    columns: list[str],
    *,
    sort_by: list[str],
    ascending: bool | list[bool] = True,
    none: str = "_no rows_\n",
) -> str:
    """The ok rows sorted by ``sort_by`` (``ascending`` as pandas takes it), as a table of those of
    ``columns`` they have; ``none`` where there are no ok rows."""
    rows = df.loc[df["status"] == "ok"].sort_values(sort_by, ascending=ascending)
    if rows.empty:
        return none
    return markdown_table(rows, [c for c in columns if c in rows])


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


def add_ratio(
    df: pd.DataFrame, keys: list[str], reference: pd.Series, metric: str, column: str
) -> pd.DataFrame:
    """Add ``column`` = this row's ``metric`` / that of the ``reference`` row (a boolean mask over
    ``df``) with the same ``keys``: a cost against a reference measured in the same run (a
    checkpoint mode's step against none's). The inverse of ``add_speedup``'s ratio."""
    base = df.loc[reference, [*keys, metric]].drop_duplicates(keys).rename(columns={metric: "_ref"})
    out = df.merge(base, on=keys, how="left")
    out[column] = out[metric].astype(float) / out["_ref"].astype(float)
    return out.drop(columns="_ref")


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

    def __init__(self, phase: str, root: Path, gpu: str = ""):
        self.phase = phase
        self.root = root
        self.gpu = gpu
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
    ) -> str:
        """One line per value of ``series``; returns ``![title](figures/...)``. The title gets the GPU
        appended (name dtype and shape in ``title``); the y-axis is linear and starts at zero."""
        fig, ax = plt.subplots(figsize=(7, 4.2))
        ax.set_title(f"{title}\n{self.gpu}" if self.gpu else title, fontsize=10)  # a long title stays whole
        title = f"{title} — {self.gpu}" if self.gpu else title
        for label, part in df.sort_values(x).groupby(series):
            ax.plot(part[x], part[y], marker="o", label=str(label))
        ax.set(xlabel=xlabel or x, ylabel=ylabel or y)
        if logx:
            ax.set_xscale("log")
        ax.set_ylim(bottom=0)  # times and throughputs: a linear axis from zero, never a log one
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
    # context and mode (lm_bench) say which cell of a shape failed, where the rows have them
    cols = ["gpu", "variant", "shape", "context", "mode", "dtype", "status", "error"]
    cols = [c for c in cols if c in failed and failed[c].notna().any()]
    if "error" in failed:
        failed = failed.assign(error=failed["error"].map(one_line))
    return "\n### Cells that did not finish\n\n" + markdown_table(failed, cols)


def one_line(error, limit: int = 240) -> str:
    """An error message as one table cell: whitespace and newlines collapsed, no column separator,
    cut at ``limit`` characters (the rows keep it whole)."""
    text = " ".join(str(error).split()).replace("|", "/") if isinstance(error, str) else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def default_render(df: pd.DataFrame, fig: Figures) -> str:
    metric_cols = [c for c in df.columns if c.endswith("ms") or c.endswith("_gb") or c.endswith("per_s")]
    cols = ["gpu", "variant", "shape", "dtype", *metric_cols]
    return markdown_table(df.loc[df["status"] == "ok"], [c for c in cols if c in df]) + failures_table(df)


@dataclass
class Verdict:
    """One headline cell: our best against the best baseline measured in the same run, and the goal
    (a ratio: baseline time / our time, or our throughput / the baseline's)."""

    phase: str
    cell: str
    ours: str
    baseline: str
    ratio: float
    goal: float | None
    gpu: str
    utc: str
    failure: str = ""  # ours failed in a run newer than every ok one: the verdict says so

    def verdict(self) -> str:
        if self.failure:
            return f"failed: {self.failure}"
        if self.goal is None:
            return "no goal"
        if pd.isna(self.ratio):
            return "not measured"
        if self.ratio >= self.goal:
            return "met"
        short = 100 * (1 - self.ratio / self.goal)
        return f"missed by {short:.1f}%" if short < 1 else f"missed by {short:.0f}%"  # never "by 0%"

    def as_row(self) -> dict:
        return {
            "phase": self.phase,
            "headline cell": self.cell,
            "ours": self.ours,
            "best baseline": self.baseline,
            "ratio": self.ratio,
            "goal": "" if self.goal is None else f"≥ {self.goal:.3g}×",
            "verdict": self.verdict(),
            "GPU": self.gpu,
            "date": str(self.utc)[:10],
        }


def best_baseline_verdict(
    phase: str,
    df: pd.DataFrame,
    *,
    cell: str,
    where: dict,
    ours: str | list[str],
    baselines: list[str],
    goal: float | None,
    metric: str = "ms",
    higher_is_better: bool = False,
) -> Verdict | None:
    """The verdict of one headline cell from the run group ``verdict_run`` picks there.

    ``where`` selects the cell's rows (column -> value); ``ours`` is our variant (or the candidates, the
    best of which counts); the ratio is taken against the best of ``baselines`` in the same run group.
    None when the cell has no ok row of ours. Where ours' newest row is an error newer than every ok
    one, the verdict is that failure, not an older run's ratio."""
    cell_rows = df
    for col, value in where.items():
        if col not in cell_rows:
            return None
        cell_rows = cell_rows.loc[cell_rows[col].astype(str) == str(value)]
    candidates = [ours] if isinstance(ours, str) else list(ours)
    rows = cell_rows.loc[cell_rows["status"] == "ok"]
    mine = rows.loc[rows["variant"].isin(candidates)]
    errors = cell_rows.loc[(cell_rows["status"] == "error") & cell_rows["variant"].isin(candidates)]
    if not errors.empty and (mine.empty or errors["utc"].max() > mine["utc"].max()):
        newest = errors.loc[errors["utc"] == errors["utc"].max()].iloc[0]
        return Verdict(
            phase, cell, str(newest["variant"]), "", float("nan"), goal, newest["gpu"], newest["utc"],
            failure=str(newest.get("error", "error"))[:120],
        )  # fmt: skip
    if mine.empty or metric not in rows:
        return None
    group = verdict_run(rows, candidates, baselines, metric, higher_is_better)
    rows = rows.loc[rows["run_group"] == group]
    values = rows.groupby("variant")[metric].median()
    pick = values.reindex(candidates).dropna()
    base = values.reindex(baselines).dropna()
    best_ours = pick.idxmax() if higher_is_better else pick.idxmin()
    if base.empty:
        ratio, best_base = float("nan"), "none measured"
    else:
        best_base = base.idxmax() if higher_is_better else base.idxmin()
        ratio = pick[best_ours] / base[best_base] if higher_is_better else base[best_base] / pick[best_ours]
    return Verdict(
        phase, cell, best_ours, best_base, float(ratio), goal, rows["gpu"].iloc[0], rows["utc"].max()
    )


def verdict_table(verdicts: list[Verdict]) -> str:
    if not verdicts:
        return "_no headline cell measured yet_\n"
    return markdown_table(pd.DataFrame([v.as_row() for v in verdicts]))


@dataclass
class PhaseReport:
    """What ``render_phase`` needs of a phase: its directory name, title, body and headline cells."""

    name: str
    title: str
    render: Callable[[pd.DataFrame, "Figures"], str] = default_render
    headline: Callable[[pd.DataFrame], list[Verdict]] = field(default=lambda df: [])


def smoke_section(df: pd.DataFrame) -> str:
    """CPU rows: which cells ran in the interpreter and which failed -- no times, no ratios."""
    cols = [c for c in ["variant", "shape", "dtype", "status", "utc", "git_commit"] if c in df]
    return (
        "Rows from Triton's interpreter on the CPU: they check that the code runs and measure "
        "nothing, so no time, ratio or verdict is shown.\n\n" + markdown_table(df, cols) + failures_table(df)
    )


def gpu_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df.loc[df["gpu"] != CPU_GPU_LABEL] if not df.empty else df


def render_phase(report: PhaseReport, out_dir: Path | None = None) -> Path | None:
    """Write ``<out_dir>/<phase>.md`` from the phase's CSVs; returns its path (None without data).

    The report opens with the headline verdicts of the newest GPU; each GPU gets its own section.
    CPU rows appear only in a smoke section, and only where there are no GPU rows (a CPU run's own
    report, under ``out/cpu``), so a committed report shows GPU rows alone.
    """
    phase = report.name
    out_dir = out_dir or reports_dir()
    df = load_phase(phase)
    if df.empty:
        return None
    on_gpu = gpu_rows(df)
    parts = [
        f"# {report.title}\n",
        f"_Generated by `just report` from `{_display(data_dir() / phase)}/*.csv`; do not edit by hand._\n",
    ]
    # Rows of different GPU models are never compared: each gets its own section, newest first.
    gpus = on_gpu.groupby("gpu")["utc"].max().sort_values(ascending=False).index
    if len(gpus):
        verdicts = [v for gpu in gpus for v in report.headline(on_gpu.loc[on_gpu["gpu"] == gpu])]
        parts += ["## Verdict\n", verdict_table(verdicts)]
    for i, gpu in enumerate(gpus):
        if len(gpus) > 1:
            parts.append(f"## On the {gpu}\n")
        # The newest GPU's figures keep the plain names the READMEs link; older GPUs' get a suffix.
        slug = phase if i == 0 else f"{phase}_{re.sub(r'[^a-z0-9]+', '_', gpu.lower()).strip('_')}"
        parts.append(report.render(on_gpu.loc[on_gpu["gpu"] == gpu], Figures(slug, out_dir, gpu)))
    if len(gpus):
        parts += ["\n## Runs\n\n", provenance_table(on_gpu)]
    else:
        parts += [
            "No GPU rows here: run this phase on a CUDA machine for measurements.\n\n",
            "## CPU smoke runs\n\n",
        ]
        parts.append(smoke_section(df))
    path = out_dir / f"{phase}.md"
    write_atomically(path, lambda tmp: tmp.write_text("\n".join(parts)))
    return path


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def render_all(reports: list[PhaseReport], out_dir: Path | None = None) -> list[Path]:
    out_dir = out_dir or reports_dir()
    written = [p for p in (render_phase(r, out_dir) for r in reports) if p is not None]
    write_index(out_dir, reports)
    return written


def write_index(out_dir: Path, reports: list[PhaseReport]) -> Path:
    """``README.md`` of the reports: one verdict table at a glance, then every phase's report."""
    verdicts, rows = [], []
    for report in reports:
        name = report.name
        what = report.title.removeprefix(name).lstrip(" —·:-")
        df = load_phase(name)
        on_gpu = gpu_rows(df)
        if on_gpu.empty:
            where = "CPU only" if not df.empty else "no data yet"
            rows.append(f"| {name} | {what} | {where} | |")
            continue
        for gpu in on_gpu.groupby("gpu")["utc"].max().sort_values(ascending=False).index:
            verdicts += report.headline(on_gpu.loc[on_gpu["gpu"] == gpu])
        gpus = ", ".join(sorted(on_gpu["gpu"].unique()))
        rows.append(f"| [{name}]({name}.md) | {what} | {gpus} | {on_gpu['utc'].max()} |")
    text = (
        "# Reports\n\n_Generated by `just report`; every number comes from `reports/data/`._\n\n"
        "## Where each phase stands\n\nOur result against the best baseline measured in the same run "
        "(ratio > 1: ours is faster), per GPU that ran the phase.\n\n"
        + verdict_table(verdicts)
        + "\n## Every report\n\n| phase | what | measured on | last GPU row (UTC) |\n|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )
    path = out_dir / "README.md"
    write_atomically(path, lambda tmp: tmp.write_text(text))
    return path
