"""Phase sparse_ffn's inputs: the generated GLUE-like sample, local GLUE data through `datasets` (a
data directory and the Hugging Face cache), the tokenizers, and the models resolved by name or path.
Nothing here reaches the network; the cache is an empty temporary one (conftest)."""

import sys

import pytest
import torch

from phases.__main__ import phase_module

transformers = pytest.importorskip("transformers")
data = phase_module("sparse_ffn", "data")
bench = phase_module("sparse_ffn", "bench")


@pytest.mark.parametrize("task", list(data.TASKS))
def test_the_generated_sample_has_the_tasks_glue_columns(task):
    sample = data.generated_sample(task, 7)
    assert set(sample.columns) == {*data.TASKS[task], "label", "idx"}
    assert len(sample) == 7 and set(sample.columns["label"]) <= {0, 1}
    assert sample.data == f"generated {task}-like sample"
    assert data.generated_sample(task, 7).columns == sample.columns  # reproducible
    if task == "qnli":
        assert all(q.endswith("?") for q in sample.columns["question"])


def write_glue(root, task, rows):
    datasets = pytest.importorskip("datasets")
    (root / task).mkdir(parents=True)
    datasets.Dataset.from_dict(rows).to_parquet(str(root / task / f"{data.SPLIT}-00000-of-00001.parquet"))


MRPC = {"sentence1": ["The cat sat.", "Stocks fell."], "sentence2": ["A cat sat.", "Markets rose."],
        "label": [1, 0], "idx": [0, 1]}  # fmt: skip


def test_glue_rows_from_a_data_dir_through_datasets_repeat_to_the_batch(tmp_path):
    write_glue(tmp_path, "mrpc", MRPC)
    sample = data.load_sample("mrpc", 5, tmp_path)
    assert sample.data == "glue/mrpc (local)"
    assert sample.columns["sentence1"] == MRPC["sentence1"] * 2 + MRPC["sentence1"][:1]
    assert sample.columns["label"] == [1, 0, 1, 0, 1]
    with pytest.raises(ValueError, match="^--data-dir: no sst2/validation"):
        data.load_sample("sst2", 2, tmp_path)
    write_glue(tmp_path, "rte", {"sentence1": ["x"], "label": [0]})
    with pytest.raises(ValueError, match="^--data-dir: .*lacks GLUE's rte columns"):
        data.load_sample("rte", 2, tmp_path)
    assert data.load_sample("mrpc", 2, generated=True).data == "generated mrpc-like sample"


def test_glue_rows_from_the_hf_cache_else_a_generated_sample_said_so(tmp_path, capsys):
    from huggingface_hub import constants

    repo = tmp_path / "hf-hub" / "datasets--nyu-mll--glue"  # the conftest's empty cache
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("c0ffee")
    write_glue(repo / "snapshots" / "c0ffee", "mrpc", MRPC)
    assert str(tmp_path / "hf-hub") == constants.HF_HUB_CACHE
    assert data.load_sample("mrpc", 2).data == "glue/mrpc (local)"
    assert data.load_sample("sst2", 2).data == "generated sst2-like sample"
    assert "sst2 is not in the local Hugging Face cache" in capsys.readouterr().out


def test_without_datasets_a_data_dir_is_an_error_and_the_cache_falls_back(tmp_path, monkeypatch, capsys):
    write_glue(tmp_path, "mrpc", MRPC)
    repo = tmp_path / "hf-hub" / "datasets--nyu-mll--glue"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("c0ffee")
    write_glue(repo / "snapshots" / "c0ffee", "mrpc", MRPC)
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(ValueError, match="^--data-dir: GLUE data needs `datasets`"):
        data.load_sample("mrpc", 2, tmp_path)
    assert data.load_sample("mrpc", 2).data == "generated mrpc-like sample"
    assert "needs `datasets`" in capsys.readouterr().out


def test_trained_tokenizers_put_special_tokens_where_the_family_expects_them(tmp_path):
    sample = data.generated_sample("mrpc", 4)
    bert = data.train_tokenizer("bert", sample.texts())
    inputs = data.encode(bert, sample, 3, 40, "cpu")
    assert set(inputs) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert inputs["input_ids"].shape == (3, 40) and inputs["labels"].tolist() == sample.columns["label"][:3]
    t = bert.tokenizer
    assert (t.pad_token_id, t.cls_token_id, t.sep_token_id) == (0, 2, 3)
    assert (inputs["input_ids"][:, 0] == 2).all() and inputs["token_type_ids"].max() == 1
    padded = inputs["attention_mask"] == 0
    assert padded.any() and (inputs["input_ids"][padded] == 0).all()
    assert "WordPiece trained here" in bert.name

    roberta = data.train_tokenizer("roberta", sample.texts())
    t = roberta.tokenizer
    assert (t.bos_token_id, t.pad_token_id, t.eos_token_id) == (0, 1, 2)  # RobertaConfig's ids
    inputs = data.encode(roberta, sample, 2, 6, "cpu")  # truncated to 6 tokens
    assert set(inputs) == {"input_ids", "attention_mask", "labels"} and inputs["input_ids"].shape == (2, 6)
    assert (inputs["input_ids"][:, 0] == 0).all() and (inputs["input_ids"][:, -1] == 2).all()

    bert.tokenizer.save_pretrained(tmp_path / "tok")
    local = data.load_tokenizer(str(tmp_path / "tok"))
    assert local.name == f"{tmp_path / 'tok'} (local)" and len(local) == len(bert)
    with pytest.raises(ValueError, match="^--tokenizer: no tokenizer found locally"):
        data.load_tokenizer(str(tmp_path / "missing"))
    assert data.model_tokenizer("bert-base-uncased") is None  # the cache is empty


def test_models_by_name_from_their_published_sizes_and_tiny_on_the_cpu():
    large = bench.resolve_model("bert-large-uncased", tiny=False)
    assert (large.family, large.config.hidden_size, large.config.num_hidden_layers) == ("bert", 1024, 24)
    assert not large.local and large.config.num_labels == 2
    roberta = bench.resolve_model("roberta-base", tiny=False)
    assert (roberta.config.vocab_size, roberta.max_seq, roberta.config.pad_token_id) == (50265, 512, 1)
    tiny = bench.resolve_model("roberta-large", tiny=True)
    assert (tiny.family, tiny.config.hidden_size, tiny.max_seq) == ("roberta", 32, bench.CPU_MAX_ROWS)
    with pytest.raises(ValueError, match="^--model: 'gpt2' is neither a local model"):
        bench.resolve_model("gpt2")


def test_without_transformers_the_model_is_refused_with_the_group_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match="^--model: .*`transformers` .*`hf` dependency group"):
        bench.resolve_model("bert-base-uncased")


def test_a_local_model_is_read_with_its_weights_and_other_families_are_refused(tmp_path):
    config = transformers.BertConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=24, max_position_embeddings=40)  # fmt: skip
    torch.manual_seed(1)
    saved = transformers.BertForSequenceClassification(config)
    saved.save_pretrained(tmp_path / "bert")
    spec = bench.resolve_model(str(tmp_path / "bert"), tiny=False)
    assert spec.local and spec.family == "bert" and spec.max_seq == 40
    tokenizer = data.train_tokenizer("bert", data.generated_sample("sst2", 8).texts(), vocab_size=200)
    model, weights = bench.build_model(spec, tokenizer, torch.float32)
    assert weights.startswith("pretrained (local")
    assert torch.equal(
        model.bert.encoder.layer[0].output.dense.weight, saved.bert.encoder.layer[0].output.dense.weight
    )
    assert model.training

    config.save_pretrained(tmp_path / "config-only")
    _, weights = bench.build_model(bench.resolve_model(str(tmp_path / "config-only"), tiny=False), tokenizer,
                                   torch.float32)  # fmt: skip
    assert weights == "random (local config, no local weights)"

    too_big = data.train_tokenizer("bert", data.generated_sample("sst2", 64).texts(), vocab_size=1000)
    assert len(too_big) > 300
    with pytest.raises(
        ValueError, match=r"^--tokenizer: its vocabulary \(\d+\) is larger than the model's \(300\)"
    ):
        bench.build_model(spec, too_big, torch.float32)

    transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="^--model: .* is a gpt2 model; only BERT and RoBERTa"):
        bench.resolve_model(str(tmp_path / "gpt2"))
