"""Phase sparse_ffn's inputs: GLUE rows and a tokenizer, local or built here; never the network.

Timing depends on batch and sequence length only (every batch is padded to the sequence length), so
what feeds the model matters for what a row *says*, not for its time: each row names its ``data``
("glue/sst2 (local)" or "generated sst2-like sample") and its ``tokenizer``.

- GLUE rows come through ``datasets`` from the parquet files of the ``nyu-mll/glue`` dataset
  repository: ``--data-dir`` (a local copy: ``<dir>/<task>/validation-*.parquet``) or, without it,
  the Hugging Face cache (looked up with ``local_files_only``). Where neither has the task, or with
  ``--generated``, a small sample with the task's GLUE columns is generated instead.
- The tokenizer is ``--tokenizer`` (a local path), else the model's own where it is local (a
  directory or the cache), else one trained here on the rows' text with the ``tokenizers`` library
  (WordPiece for BERT, byte-level BPE for RoBERTa, with their special tokens at the ids their configs
  expect) and wrapped as a ``transformers.PreTrainedTokenizerFast``.

``transformers``, ``tokenizers`` and ``datasets`` are the ``hf`` dependency group; they are imported
where used. A missing ``datasets`` only matters where GLUE data is asked for.
"""

import random
from dataclasses import dataclass
from pathlib import Path

import torch

GLUE_REPO = "nyu-mll/glue"
SPLIT = "validation"  # the split with labels (GLUE's test labels are hidden)
# The GLUE tasks with binary labels: one classification head serves all of them. Their text columns.
TASKS = {
    "sst2": ("sentence",),
    "cola": ("sentence",),
    "mrpc": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
}
NUM_LABELS = 2

# Words for the generated sample: enough variety that a trained tokenizer sees subwords and lengths
# vary as GLUE's sentences do; their meaning is irrelevant to the timing.
_LINES = (
    "the a this that film movie story actor plot scene music director script performance audience",
    "year city river company market report study team player game court law government season",
    "record album song was is were has had will would could may not never always quietly very",
    "rather too barely often good bad dull bright clever tedious moving funny long short remarkable",
    "forgettable honest strange new old first last of in on at with without for about after before",
    "because while and but or so then than said found shows made takes gives announced reported denied",
)
_WORDS = [word for line in _LINES for word in line.split()]


@dataclass
class Sample:
    """Rows of one GLUE task: ``columns`` maps GLUE's column names to lists; ``data`` names the source."""

    task: str
    columns: dict[str, list]
    data: str

    def texts(self) -> list[str]:
        return [t for name in TASKS[self.task] for t in self.columns[name]]

    def __len__(self) -> int:
        return len(self.columns["label"])


def _sentence(rng: random.Random, lo: int, hi: int, end: str = ".") -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))) + " " + end


def generated_sample(task: str, rows: int, seed: int = 0) -> Sample:
    """``rows`` made-up rows with GLUE's columns for ``task`` (its text columns, ``label``, ``idx``)."""
    check_task(task)
    rng = random.Random(f"{task}:{seed}")
    columns: dict[str, list] = {name: [] for name in TASKS[task]}
    for _ in range(rows):
        for name in TASKS[task]:
            question = name == "question"
            columns[name].append(_sentence(rng, 3, 12, "?") if question else _sentence(rng, 4, 30))
    columns["label"] = [rng.randint(0, NUM_LABELS - 1) for _ in range(rows)]
    columns["idx"] = list(range(rows))
    return Sample(task, columns, f"generated {task}-like sample")


def check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"--task: unknown GLUE task {task!r}; expected one of {', '.join(TASKS)}")


def _parquet_files(root: Path, task: str) -> list[Path]:
    return sorted((root / task).glob(f"{SPLIT}-*.parquet"))


def _cached_glue(task: str) -> Path | None:
    """The Hugging Face cache's snapshot of the GLUE repository if it holds ``task``'s split."""
    from huggingface_hub import snapshot_download

    try:
        root = Path(
            snapshot_download(
                GLUE_REPO, repo_type="dataset", local_files_only=True, allow_patterns=f"{task}/*"
            )
        )
    except OSError:  # not in the cache (LocalEntryNotFoundError is an OSError)
        return None
    return root if _parquet_files(root, task) else None


def load_sample(task: str, rows: int, data_dir: Path | None = None, generated: bool = False) -> Sample:
    """The first ``rows`` rows of ``task``'s validation split (repeated where it has fewer): from
    ``data_dir`` if given, else from the Hugging Face cache, else (or with ``generated``) made up.
    Prints where the cache was looked in and not found, so a generated sample never passes unnoticed."""
    check_task(task)
    if generated:
        return generated_sample(task, rows)
    if data_dir is not None:
        files = _parquet_files(Path(data_dir), task)
        if not files:
            raise ValueError(
                f"--data-dir: no {task}/{SPLIT}-*.parquet under {data_dir} (expected the layout of the "
                f"{GLUE_REPO} dataset repository)"
            )
        return _read_parquet(task, files, rows, required=True)
    root = _cached_glue(task)
    if root is None:
        print(f"data: {GLUE_REPO} {task} is not in the local Hugging Face cache; using a generated sample")
        return generated_sample(task, rows)
    sample = _read_parquet(task, _parquet_files(root, task), rows, required=False)
    return sample if sample is not None else generated_sample(task, rows)


def _read_parquet(task: str, files: list[Path], rows: int, *, required: bool) -> Sample | None:
    try:
        import datasets
    except ImportError:
        message = "GLUE data needs `datasets` (the project's `hf` dependency group: `uv sync --group hf`)"
        if required:
            raise ValueError(f"--data-dir: {message}") from None
        print(f"data: {message}; using a generated sample")
        return None
    table = datasets.Dataset.from_parquet([str(f) for f in files])
    missing = [c for c in (*TASKS[task], "label") if c not in table.column_names]
    if missing or len(table) == 0:
        where = "--data-dir: " if required else ""
        raise ValueError(f"{where}{files[0]} has no rows or lacks GLUE's {task} columns {missing}")
    picked = table.select([i % len(table) for i in range(rows)])
    columns = {c: picked[c] for c in (*TASKS[task], "label")}
    return Sample(task, columns, f"glue/{task} (local)")


# --- the tokenizer --------------------------------------------------------------------------------

# Special tokens in id order. BERT's config pads with id 0; RoBERTa's expects <s> 0, <pad> 1, </s> 2.
_SPECIALS = {
    "bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
}
TRAINED_VOCAB = 2000  # the trained tokenizer's target size: a sample of a few dozen rows fills less


@dataclass
class Tokenizer:
    tokenizer: object  # a transformers PreTrainedTokenizerFast
    name: str  # the ``tokenizer`` column of the rows

    def __len__(self) -> int:
        return len(self.tokenizer)


def load_tokenizer(path: str) -> Tokenizer:
    """``path``'s tokenizer (a directory, or a name in the Hugging Face cache), never downloaded."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(f"--tokenizer: no tokenizer found locally at {path!r} ({err})") from None
    return Tokenizer(tok, f"{path} (local)")


def model_tokenizer(model: str) -> Tokenizer | None:
    """The model's own tokenizer where it is local (its directory or the cache), else None."""
    from transformers import AutoTokenizer

    try:
        return Tokenizer(AutoTokenizer.from_pretrained(model, local_files_only=True), f"{model} (local)")
    except (OSError, ValueError):
        return None


def train_tokenizer(family: str, texts: list[str], vocab_size: int = TRAINED_VOCAB) -> Tokenizer:
    """A tokenizer of ``family``'s kind trained on ``texts``: WordPiece (lower-cased, [CLS] A [SEP]
    B [SEP]) for BERT, byte-level BPE (<s> A </s></s> B </s>) for RoBERTa."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = _SPECIALS[family]
    if family == "bert":
        pad, unk, cls, sep, mask = specials
        tok = HFTokenizer(models.WordPiece(unk_token=unk))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=specials, show_progress=False
        )
        tok.train_from_iterator(texts, trainer)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, specials.index(cls)), (sep, specials.index(sep))],
        )
        tok.decoder = decoders.WordPiece()
        extra = {"model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}
        kind = "WordPiece"
    else:
        cls, pad, sep, unk, mask = specials
        tok = HFTokenizer(models.BPE(unk_token=unk))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        tok.post_processor = processors.RobertaProcessing(
            (sep, specials.index(sep)), (cls, specials.index(cls))
        )
        tok.decoder = decoders.ByteLevel()
        extra = {"bos_token": cls, "eos_token": sep, "model_input_names": ["input_ids", "attention_mask"]}
        kind = "byte-level BPE"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=pad,
        unk_token=unk,
        cls_token=cls,
        sep_token=sep,
        mask_token=mask,
        **extra,
    )
    return Tokenizer(fast, f"{kind} trained here on the rows' text (vocab {len(fast)})")


def encode(tokenizer: Tokenizer, sample: Sample, batch: int, seq: int, device) -> dict[str, torch.Tensor]:
    """The first ``batch`` rows of ``sample`` as model inputs padded and truncated to ``seq`` tokens,
    with their labels."""
    texts = [sample.columns[name][:batch] for name in TASKS[sample.task]]
    enc = tokenizer.tokenizer(
        *texts, padding="max_length", truncation=True, max_length=seq, return_tensors="pt"
    )
    inputs = {k: v.to(device) for k, v in enc.items()}
    inputs["labels"] = torch.tensor(sample.columns["label"][:batch], device=device)
    return inputs
