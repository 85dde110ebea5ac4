"""The shared conftest's per-test log (``TRITONLAB_TEST_LOG``): a line per test as it ends."""

import json
import types

import pytest

from tests import conftest


def _report(nodeid, when, outcome, text=""):
    return types.SimpleNamespace(
        nodeid=nodeid, when=when, outcome=outcome, failed=outcome == "failed", duration=1.23456,
        longreprtext=text,
    )  # fmt: skip


def test_each_call_and_each_failure_is_a_line_as_it_ends(tmp_path, monkeypatch):
    log = tmp_path / "tests.jsonl"
    monkeypatch.setenv("TRITONLAB_TEST_LOG", str(log))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    conftest.pytest_runtest_logreport(_report("t.py::ok", "setup", "passed"))  # not a line
    conftest.pytest_runtest_logreport(_report("t.py::ok", "call", "passed"))
    conftest.pytest_runtest_logreport(_report("t.py::bad", "call", "failed", "E   AssertionError: 2 != 3"))
    conftest.pytest_runtest_logreport(_report("t.py::fixture", "setup", "failed", "E   OutOfMemoryError"))
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(x["test"], x["when"], x["outcome"]) for x in lines] == [
        ("t.py::ok", "call", "passed"),
        ("t.py::bad", "call", "failed"),
        ("t.py::fixture", "setup", "failed"),
    ]
    assert lines[0]["seconds"] == 1.235 and lines[0]["error"] == "" and "2 != 3" in lines[1]["error"]


def test_xdist_workers_leave_the_line_to_the_controller(tmp_path, monkeypatch):
    log = tmp_path / "tests.jsonl"
    monkeypatch.setenv("TRITONLAB_TEST_LOG", str(log))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    conftest.pytest_runtest_logreport(_report("t.py::ok", "call", "passed"))
    assert not log.exists()


def test_shards_partition_the_tests_that_would_run(monkeypatch):
    deselected = []
    config = types.SimpleNamespace(
        hook=types.SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items))
    )
    names = [f"t{i}" for i in range(11)]
    shards = []
    for k in range(3):
        monkeypatch.setenv("TRITONLAB_TEST_SHARD", f"{k}/3")
        items = [types.SimpleNamespace(name=n, keywords={}, add_marker=lambda m: None) for n in names]
        conftest.pytest_collection_modifyitems(config, items)
        shards.append([item.name for item in items])
    assert sorted(sum(shards, [])) == sorted(names) and shards[0] == ["t0", "t3", "t6", "t9"]
    assert len(deselected) == 2 * len(names)


@pytest.mark.parametrize("value", ["3/3", "1", "a/b", "-1/2", "0/0"])
def test_a_bad_shard_is_a_usage_error_naming_the_variable(value):
    with pytest.raises(pytest.UsageError, match="TRITONLAB_TEST_SHARD: expected K/N"):
        conftest.shard_of(value)


def test_the_slurm_tests_share_one_xdist_worker(monkeypatch):
    monkeypatch.delenv("TRITONLAB_TEST_SHARD", raising=False)
    marks = {}

    def item(name, keywords):
        return types.SimpleNamespace(
            name=name, keywords=keywords, add_marker=lambda m: marks.setdefault(name, m)
        )

    items = [item("cluster", {"slurm": True}), item("kernel", {})]
    conftest.pytest_collection_modifyitems(types.SimpleNamespace(), items)
    assert marks["cluster"].name == "xdist_group" and marks["cluster"].args == ("slurm",)
    assert "kernel" not in marks
