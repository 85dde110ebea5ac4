"""common.provenance: which commit a row names, in a checkout and in a shipped copy of the tree."""

import sys

import pytest

import common.provenance  # noqa: F401

# The module itself: the package re-exports its function of the same name.
prov = sys.modules["common.provenance"]


@pytest.fixture
def fake_tree(tmp_path, monkeypatch):
    def make(head: str, stamp: str | None, dirty: bool = False):
        answers = {"rev-parse": head, "status": " M x.py" if dirty else ""}
        monkeypatch.setattr(prov, "_git", lambda *args: answers[args[0]])
        monkeypatch.setattr(prov, "REPO_ROOT", tmp_path)
        if stamp is not None:
            (tmp_path / ".tritonlab_commit").write_text(stamp + "\n")
        prov._static_provenance.cache_clear()
        row = prov._static_provenance()
        prov._static_provenance.cache_clear()
        return row["git_commit"], row["git_dirty"]

    return make


def test_a_checkout_names_its_head(fake_tree):
    assert fake_tree("abc123", "abc123", dirty=True) == ("abc123", True)
    assert fake_tree("abc123", None) == ("abc123", False)


def test_a_copy_with_a_stale_git_names_the_stamped_commit(fake_tree):
    assert fake_tree("old000", "new111", dirty=True) == ("new111", "unknown")
    assert fake_tree("", "new111") == ("new111", "unknown")
