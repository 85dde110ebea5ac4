"""Phase sparse_ffn's tests see an empty Hugging Face cache: what a developer's machine has cached
(GLUE, bert-base-uncased's tokenizer) must not change what the tests check, and nothing is written
into the real cache."""

import pytest


@pytest.fixture(autouse=True)
def _empty_hf_cache(tmp_path, monkeypatch):
    constants = pytest.importorskip("huggingface_hub.constants")
    # Read at call time by huggingface_hub and transformers (setting the environment is too late).
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    try:
        import datasets
    except ImportError:
        return
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
