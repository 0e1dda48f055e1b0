"""Sequence classification on the built-in corpus: which standard-library package a snippet comes from.

Shapes: N snippets, B = local batch rows, T = data.seq_len.
Labels come from the `path` feature of `stdlib_py`: the top-level directory of a file, when it is one
of `data.classes` (default `DEFAULT_CLASSES`, packages present in Python 3.11–3.13 with 30–125 files
each); other files are left out. Each file is cut into snippets of T tokens: bos + T − 1 tokens of
the file, non-overlapping, the last one kept (padded) when at least half full. To keep the classes
balanced-ish, each class keeps at most MAX_CLASS_RATIO × the smallest class's snippets of the split
(a fixed random subset).
Files are split by their own hash (`split_of`, HOLDOUT_PERCENT% to "validation", whatever the corpus
split): the corpus's 2% validation split holds too few files of these packages. A masked LM
pre-trained on the corpus's train split has therefore seen the text (never the labels) of some
classification validation files.
A batch holds: inputs, segment_ids (1 real, 0 padding), positions int32 [B, T]; labels int32 [B, 1];
weights float32 [B, 1] (0 on the all-padding rows that fill a last, partial batch). (The trailing 1
lets every batch array share the [batch, seq] sharding.) Global batch s is snippets [s·G, (s+1)·G) of
the (shuffled, repeated) snippet sequence; process p of n reads its contiguous B = G/n of them
(batches.py), so the batches do not depend on the number of processes.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import json

import grain
import numpy as np

from transformer.data import corpus, tokenizers
from transformer.data.batches import BatchIterator, RowBlocks, default_rows, local_batch_size
from transformer.data.identity import RunData
from transformer.data.mlm import transform_seed
from transformer.spec import ConfigError, DataSpec

DEFAULT_CLASSES = ("asyncio", "email", "encodings", "idlelib", "tkinter", "unittest")
HOLDOUT_PERCENT = 20
MAX_CLASS_RATIO = 2        # a class keeps at most this many times the smallest class's snippets
SUBSAMPLE_SEED = 0
SPLITS = ("train", "validation")


def split_of(path: str) -> str:
    """"validation" for ~HOLDOUT_PERCENT% of files (sha1 of the path, salted), else "train"."""
    digest = hashlib.sha1(f"classification:{path}".encode("utf-8")).digest()
    return "validation" if int.from_bytes(digest[:8], "big") % 100 < HOLDOUT_PERCENT else "train"


def label_of(path: str, classes: tuple[str, ...]) -> int | None:
    """Index in `classes` of the file's top-level package, or None."""
    top = path.split("/", 1)[0] if "/" in path else None
    return classes.index(top) if top in classes else None


def classes_of(data_cfg: DataSpec) -> tuple[str, ...]:
    classes = tuple(data_cfg.get("classes", DEFAULT_CLASSES))
    if len(classes) < 2 or len(set(classes)) != len(classes):
        raise ConfigError(f"data.classes={classes!r} must name at least two distinct top-level packages")
    return classes


def _snippets(ids_L: np.ndarray, seq_len: int, bos_id: int) -> list[np.ndarray]:
    body = seq_len - 1
    return [np.concatenate([[bos_id], ids_L[i:i + body]]).astype(np.int32)
            for i in range(0, len(ids_L), body) if len(ids_L[i:i + body]) * 2 >= body]


_TOKENIZERS: dict[str, tokenizers.Tokenizer] = {}  # fingerprint -> tokenizer, for _load's memo key


@functools.lru_cache(maxsize=8)
def _load(data_cfg_json: str, split: str, tokenizer_fingerprint: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens_NT, lengths_N, labels_N) of `split`, cached per data settings and tokenizer."""
    data_cfg = DataSpec.of(json.loads(data_cfg_json))
    tokenizer = _TOKENIZERS[tokenizer_fingerprint]
    classes, seq_len = classes_of(data_cfg), int(data_cfg.seq_len)
    tokens, lengths, labels = [], [], []
    for corpus_split in (data_cfg.train_split, data_cfg.eval_split):
        source = corpus.load_split(data_cfg, corpus_split)
        for i in range(len(source)):
            record = source[i]
            path = record["path"].decode("utf-8") if isinstance(record["path"], bytes) else record["path"]
            label = label_of(path, classes)
            if label is None or split_of(path) != split:
                continue
            for snippet in _snippets(tokenizer.encode(record["text"]), seq_len, tokenizer.bos_id):
                tokens.append(np.pad(snippet, (0, seq_len - len(snippet))))
                lengths.append(len(snippet))
                labels.append(label)
    labels_N = np.asarray(labels, np.int32)
    counts_C = np.bincount(labels_N, minlength=len(classes))
    if counts_C.min() == 0:
        missing = [c for c, n in zip(classes, counts_C) if n == 0]
        raise ConfigError(f"data.classes: no files of {missing} in the {split!r} split of this corpus")
    rng = np.random.default_rng(SUBSAMPLE_SEED)
    cap = MAX_CLASS_RATIO * int(counts_C.min())
    keep_N = np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels_N == c))[:cap]
                                     for c in range(len(classes))]))
    return np.stack(tokens)[keep_N], np.asarray(lengths, np.int32)[keep_N], labels_N[keep_N]


def load_snippets(data_cfg: DataSpec, split: str,
                  tokenizer: tokenizers.Tokenizer | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens_NT int32, lengths_N, labels_N) of the classification split ("train" | "validation"), tokenized
    with `tokenizer` (default: the one data.tokenizer names)."""
    if data_cfg.tfds_name != corpus.BUILTIN_NAME:
        raise ConfigError(f"classification needs data.tfds_name={corpus.BUILTIN_NAME!r} (labels come from its "
                          f"`path` feature), got {data_cfg.tfds_name!r}")
    if split not in SPLITS:
        raise ConfigError(f"classification split {split!r} is not valid; choose one of {', '.join(SPLITS)}")
    d = data_cfg.to_dict()
    d["classes"] = list(classes_of(data_cfg))
    d["data_dir"] = corpus.resolve_data_dir(data_cfg)
    tokenizer = tokenizer if tokenizer is not None else tokenizers.get_tokenizer(data_cfg)
    _TOKENIZERS[tokenizer.fingerprint] = tokenizer
    return _load(json.dumps(d, sort_keys=True, default=str), split, tokenizer.fingerprint)


def class_counts(data_cfg: DataSpec, split: str) -> dict[str, int]:
    """Snippets per class name in `split`."""
    labels = load_snippets(data_cfg, split)[2]
    counts = collections.Counter(labels.tolist())
    return {name: counts.get(i, 0) for i, name in enumerate(classes_of(data_cfg))}


def majority_baseline(data_cfg: DataSpec, split: str = "validation") -> float:
    """Accuracy of always predicting the most frequent class of `split`."""
    counts = class_counts(data_cfg, split)
    return max(counts.values()) / sum(counts.values())


class _Snippets:
    """Random access to the snippets as feature dicts (a grain source)."""

    def __init__(self, tokens_NT: np.ndarray, lengths_N: np.ndarray, labels_N: np.ndarray):
        self._tokens, self._lengths, self._labels = tokens_NT, lengths_N, labels_N

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        T = self._tokens.shape[1]
        real_T = np.arange(T) < self._lengths[i]
        return {"inputs": self._tokens[i], "segment_ids": real_T.astype(np.int32),
                "positions": (np.arange(T) * real_T).astype(np.int32), "labels": self._labels[i:i + 1],
                "weights": np.ones(1, np.float32)}


class _PaddedTo:
    """`source` followed by all-zero rows (weights 0) up to `length` items."""

    def __init__(self, source: grain.MapDataset, length: int):
        self._source, self._length = source, length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if i < len(self._source):
            return self._source[i]
        return {k: np.zeros_like(v) for k, v in self._source[0].items()}


class _SelectRows:
    """A global batch -> this process's rows of it (picklable, for grain's worker processes)."""

    def __init__(self, rows: RowBlocks):
        self._index = np.concatenate([np.arange(a, b) for a, b in rows])

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v[self._index] for k, v in batch.items()}


def make_classification_iterator(data_cfg: DataSpec, *, split: str, global_batch_size: int,
                                 seed: int, process_index: int = 0, process_count: int = 1, shuffle: bool = True,
                                 repeat: bool = True, data: RunData | None = None,
                                 rows: RowBlocks | None = None) -> BatchIterator:
    """A checkpointable iterator over this process's labelled [B, T] batches (see the module docstring).

    `split` is data.train_split or data.eval_split, read as the classification split "train" or
    "validation". `data`: the run's resolved data (its tokenizer; identity.resolve_data); `rows`: the rows of
    each global batch this process feeds (batches.process_rows), default rows [p·B, (p+1)·B).
    """
    name = "validation" if split == data_cfg.eval_split else "train" if split == data_cfg.train_split else split
    batch_B = local_batch_size(global_batch_size, process_count)
    snippets = grain.MapDataset.source(_Snippets(*load_snippets(data_cfg, name,
                                                                 data.tokenizer if data is not None else None)))
    if shuffle:
        snippets = snippets.shuffle(seed=transform_seed(data_cfg, seed, salt=3))
    if repeat:
        snippets = snippets.repeat()
    else:  # whole global batches: the last one padded
        padded = -(-len(snippets) // global_batch_size) * global_batch_size
        snippets = grain.MapDataset.source(_PaddedTo(snippets, padded))
    workers = int(data_cfg.get("worker_count", 0))
    if rows is None or tuple(rows) == default_rows(global_batch_size, process_index, process_count):
        # item k of batch(B) is snippets [k·B, (k+1)·B): process p's part of global batch s is item s·n + p
        return BatchIterator(snippets.batch(batch_B)[process_index::process_count], worker_count=workers)
    return BatchIterator(snippets.batch(global_batch_size).map(_SelectRows(rows)), worker_count=workers)
