"""``python -m phases report`` renders the committed rows on any machine: rendering reads CSVs and runs
no kernel, so a machine without a GPU re-renders ``reports/`` from ``reports/data`` too."""

import shutil
import sys

import common.provenance  # noqa: F401
from common.provenance import REPO_ROOT
from phases.__main__ import report

prov = sys.modules["common.provenance"]  # the module: the package re-exports its function of that name


def test_report_renders_reports_data_without_a_gpu(tmp_path, monkeypatch):
    data = tmp_path / "reports" / "data" / "02_attn_fwd"
    data.mkdir(parents=True)
    for csv in (REPO_ROOT / "reports" / "data" / "02_attn_fwd").glob("*.csv"):
        shutil.copy(csv, data)
    monkeypatch.setattr(prov, "REPO_ROOT", tmp_path)
    monkeypatch.delenv("TRITONLAB_DATA_DIR")
    report(["02"])
    text = (tmp_path / "reports" / "02_attn_fwd.md").read_text()
    assert "## Verdict" in text and "CPU smoke runs" not in text
    assert "02_attn_fwd" in (tmp_path / "reports" / "README.md").read_text()
