"""Named evaluation sets (`data.eval_sets`): each set's documents tokenized once, evaluated at every evaluation.

A set is either local files (the formats of data.files, read with data.text_feature) or HELDOUT, the run's own
evaluation split (split "eval" of the run's token cache: data.eval_split, data.eval_files or the held-out
documents). A set of files is tokenized once into a token cache of one split, "eval" (token_cache.
ensure_split_cache), under the run's cache root (sources.cache_root), keyed by the set's documents — a hash of
data.text_feature and each file's path relative to the set's common folder and content SHA-256, never a
modification time (`source`) — and the tokenizer. The sets are not part of the run's data identity: a changed
file makes a new cache, and the values follow it.

Evaluation on training data is refused as it is for data.eval_files: a file of a set that is a file of data.files
(the same path or the same content) when the data settings are checked (`check_files`, from
identity.check_settings: before anything is read or written), and a document of a set whose tokens are a
training document's when the run opens its sets (`open_sets`, with the run's data, before its first write).
The run's own split keeps its rule (its overlap count, as summary.json's eval_train_overlap_documents).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from transformer.data import documents, sources, token_cache
from transformer.spec import ConfigError, DataSpec
from transformer.spec.data import HELDOUT

SOURCE_PREFIX = "evalset:"
SPLIT = "eval"  # a set's one split in its cache


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """A named set ready to read: its token cache `path` and `split` there; `overlap_documents`: its documents
    whose tokens are also a training document's (0 for a set of files: more is refused)."""
    name: str
    path: str
    split: str
    overlap_documents: int


def setting(name: str) -> str:
    return f"data.eval_sets.{name}"


def set_files(name: str, globs: tuple[str, ...]) -> list[str]:
    """The sorted files of set `name` (documents.expand: every glob matches, known extensions)."""
    return documents.expand(setting(name), list(globs))


def check_files(data_cfg: DataSpec, split: dict[str, tuple[str, list[str]]] | None = None) -> None:
    """ConfigError when a set's file is a file of data.files (the same path, or the same content); `split`:
    documents.split_files(data_cfg), when the caller has it. Every set's globs are expanded (each must match)."""
    data_cfg = DataSpec.of(data_cfg)
    train = []
    if data_cfg.uses_files:
        split = documents.split_files(data_cfg) if split is None else split
        train = split["train"][1]
    train_digests = documents.file_digests({"train": ("data.files", train)})
    by_digest = {d: p for p, d in train_digests.items()}
    real_train = {os.path.realpath(p): p for p in train}
    for name, target in data_cfg.eval_set_list:
        if target == HELDOUT:
            continue
        paths = set_files(name, target)
        digests = documents.file_digests({name: (setting(name), paths)})
        same = [(p, real_train.get(os.path.realpath(p)) or by_digest[digests[p]]) for p in paths
                if os.path.realpath(p) in real_train or digests[p] in by_digest]
        if same:
            pairs = ", ".join(f"{e} = {t}" for e, t in same[:3])
            raise ConfigError(f"{setting(name)}: {len(same)} file(s) are files of data.files ({pairs}"
                              f"{', ...' if len(same) > 3 else ''}): evaluation would be on training data; remove "
                              f"them from the set")


def source(data_cfg: DataSpec, name: str, paths: list[str]) -> str:
    """The set's document fingerprint (the module docstring): SOURCE_PREFIX + a hash of the text field and each
    file's relative path and content digest."""
    digests = documents.file_digests({name: (setting(name), paths)})
    root = documents.common_root(paths)
    h = hashlib.sha256(f"evalset-v1\ntext_feature={data_cfg.text_feature}\n".encode())
    for path in paths:
        h.update(f"{os.path.relpath(path, root)}|{digests[path]}\n".encode())
    return SOURCE_PREFIX + h.hexdigest()[:20]


def _texts(paths: list[str], text_feature: str, where: str) -> Iterator[str]:
    for path in paths:
        yield from documents.read_file(path, text_feature, where)


def _empty(name: str) -> ConfigError:
    return ConfigError(f"{setting(name)} holds no documents (the files are empty)")


@functools.lru_cache(maxsize=4)
def _train_hashes(train_cache: str) -> np.ndarray:
    """uint64 [D]: the training documents' hashes (token_cache.document_hash), once per process and cache."""
    return token_cache.split_hashes(token_cache.open_split(train_cache, "train"))


def open_sets(data: Any, train_cache: str, verbose: bool = True) -> list[EvalSet]:
    """The run's sets (data.eval_sets of `data.config`, `data`: its identity.RunData), each cache built on first
    use with the run's tokenizer; `train_cache`: the run's token cache (its "train" split is what a set may not
    hold). ConfigError naming the set when one of its documents is a training document."""
    data_cfg: DataSpec = data.config
    out = []
    for name, target in data_cfg.eval_set_list:
        if target == HELDOUT:
            out.append(EvalSet(name, train_cache, "eval", token_cache.overlap_documents(train_cache)))
            continue
        paths = set_files(name, target)
        path = token_cache.ensure_split_cache(
            sources.cache_root(data_cfg), source(data_cfg, name, paths), data.tokenizer,
            functools.partial(_texts, paths, data_cfg.text_feature, setting(name)), functools.partial(_empty, name),
            verbose, split=SPLIT)
        hashes = token_cache.split_hashes(token_cache.open_split(path, SPLIT))
        overlap = int(np.isin(hashes, _train_hashes(train_cache)).sum())
        if overlap:
            raise ConfigError(f"{setting(name)}: {overlap} of its {len(hashes)} documents are also documents of the "
                              f"training data (same text): evaluation would be on training data; remove them from "
                              f"the set")
        out.append(EvalSet(name, path, SPLIT, 0))
    return out
