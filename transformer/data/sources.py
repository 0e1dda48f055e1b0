"""Where a config's documents come from: local files (`data.files`, documents.py) or a TFDS dataset
(`data.tfds_name`, corpus.py). Both are tokenized once into the token cache (token_cache.py), whose two
splits are "train" and "eval": `data.train_split` and `data.eval_split` of a TFDS dataset, the training
files and the evaluation files (or the held-out documents) of local files.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Iterator


from transformer.data import corpus, documents
from transformer.spec import ConfigError, DataSpec

CACHE_SPLITS = ("train", "eval")


def check_source(data_cfg: DataSpec) -> None:
    """One source of documents: `data.files` replaces the TFDS dataset, so a data.tfds_name other than the default
    (the built-in corpus) beside it would be silently ignored; that is a ConfigError naming both settings."""
    data_cfg = DataSpec.of(data_cfg)
    name = data_cfg.tfds_name
    if data_cfg.uses_files and name not in ("", corpus.BUILTIN_NAME):
        raise ConfigError(f"data.files={data_cfg.files!r} and data.tfds_name={name!r} both name the documents; "
                          f"data.files replaces the TFDS dataset: set data.files='' to train on {name!r}, or leave "
                          f"data.tfds_name at its default ({corpus.BUILTIN_NAME!r}) to train on the files")


def check_splits(data_cfg: DataSpec) -> None:
    """A TFDS dataset's data.eval_split must be another split than data.train_split (local files have their
    own rule: data.eval_files or data.eval_fraction, identity.check_settings). The check is DataSpec's."""
    DataSpec.of(data_cfg)


def cache_split(data_cfg: DataSpec, split: str) -> str:
    """The cache split ("train"/"eval") that `split` names: data.train_split or data.eval_split."""
    check_splits(data_cfg)
    if split == data_cfg.train_split:
        return "train"
    if split == data_cfg.eval_split:
        return "eval"
    raise ConfigError(f"split {split!r} is neither data.train_split={data_cfg.train_split!r} nor "
                      f"data.eval_split={data_cfg.eval_split!r}")


def _tfds_split(data_cfg: DataSpec, split: str) -> str:
    return data_cfg.train_split if split == "train" else data_cfg.eval_split


def texts(data_cfg: DataSpec, split: str) -> Iterator[str]:
    """The non-empty documents of cache split `split`, in a fixed order (files: sorted, each in file
    order; TFDS: record order)."""
    data_cfg = DataSpec.of(data_cfg)
    if data_cfg.uses_files:
        yield from documents.iter_split(data_cfg, split)
        return
    source = corpus.load_split(data_cfg, _tfds_split(data_cfg, split))
    for i in range(len(source)):
        text = source[i]["text"]
        if text:
            yield text.decode("utf-8", errors="replace")


def empty_split_error(data_cfg: DataSpec, split: str) -> ConfigError:
    """The error for a cache split without a document, naming the setting that defines it."""
    data_cfg = DataSpec.of(data_cfg)
    if not data_cfg.uses_files:
        return ConfigError(f"split {_tfds_split(data_cfg, split)!r} of data.tfds_name={data_cfg.tfds_name!r} holds "
                           f"no documents (every record's data.text_feature={data_cfg.text_feature!r} is empty)")
    if split == "train":
        return ConfigError(f"data.files={data_cfg.files!r} holds no documents (the files are empty)")
    if data_cfg.has_eval_files:
        return ConfigError(f"data.eval_files={data_cfg.eval_files!r} holds no documents (the files are empty)")
    return ConfigError(f"the eval split is empty: data.eval_fraction={data_cfg.eval_fraction} held out no "
                       "document of data.files; raise it or set data.eval_files")


@functools.lru_cache(maxsize=64)
def _tfds_fingerprint(data_json: str) -> str:
    """Memoised per process: a prepared TFDS dataset does not change while a run reads it."""
    d = json.loads(data_json)  # the dataset (name, dir, feature) as a spec; its splits are hashed by name
    dataset = DataSpec.of({k: d[k] for k in ("tfds_name", "text_feature", "data_dir")})
    return corpus.fingerprint(dataset, [d["train_split"], d["eval_split"]])


def fingerprint(data_cfg: DataSpec) -> str:
    """A hash of what defines the documents of both cache splits (a changed file or dataset changes it): local files'
    documents.files_fingerprint (content-addressed), a TFDS dataset's corpus.fingerprint ("tfds:...")."""
    data_cfg = DataSpec.of(data_cfg)
    if data_cfg.uses_files:
        return documents.files_fingerprint(data_cfg)
    keys = ("tfds_name", "text_feature", "train_split", "eval_split")
    identity = {**{k: data_cfg[k] for k in keys}, "data_dir": corpus.resolve_data_dir(data_cfg)}
    return _tfds_fingerprint(json.dumps(identity, sort_keys=True))


def is_available(data_cfg: DataSpec) -> bool:
    """Whether the documents can be read without building or downloading anything."""
    data_cfg = DataSpec.of(data_cfg)
    return data_cfg.uses_files or corpus.is_prepared(data_cfg)


def cache_root(data_cfg: DataSpec) -> str:
    """`data.cache_dir`; else ~/.cache/transformer for local files and the TFDS data dir for a dataset
    (next to it, as its trained SentencePiece models are)."""
    data_cfg = DataSpec.of(data_cfg)
    if data_cfg.cache_dir or data_cfg.uses_files:
        return documents.cache_dir(data_cfg)
    return corpus.resolve_data_dir(data_cfg)
