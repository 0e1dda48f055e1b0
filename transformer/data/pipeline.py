"""Grain input pipeline for language modelling: shard -> shuffle -> tokenize -> pack -> batch.

TFDS datasets go through the pipeline below; local files (`data.files`) are tokenized once into a
cache (token_cache.py) and packed from it by global row index (packed.py), into the same features.

Shapes: B = local batch rows (global batch // process count), T = data.seq_len.
Each batch is a dict of numpy arrays, all [B, T]:
  inputs      int32  token ids
  targets     int32  the next token (inputs shifted left by one within the packed stream)
  segment_ids int32  0 = padding, 1, 2, ... = the documents (or document pieces) in the row
  positions   int32  position within the document piece, restarting at 0 for each segment
  weights     float32 1 where `targets` is the real next token of the same document, else 0

Documents are `bos + tokens + eos`, concatenated and split into rows of T + 1 tokens by grain's
ConcatThenSplit packing (a document longer than a row continues in the next row, as a new segment
whose positions restart at 0); a row's first T tokens are the inputs, its last T the targets.
"""
from __future__ import annotations

import functools
from typing import Any

import grain
import ml_collections
import numpy as np
import scipy.stats

from transformer.data import corpus, documents, packed, token_cache, tokenizers
from transformer.models.config import ConfigError

_READ_THREADS = 2          # threads reading + tokenizing documents ahead of the packer
_READ_PREFETCH = 64        # documents read ahead


class _Tokenize(grain.transforms.Map):
    """{"text": bytes} -> {"tokens": int32[L]} = bos + encode(text) + eos."""

    def __init__(self, tokenizer: tokenizers.Tokenizer):
        self._tok = tokenizer
        self._bos = np.array([tokenizer.bos_id], np.int32)
        self._eos = np.array([tokenizer.eos_id], np.int32)

    def map(self, record: dict[str, Any]) -> dict[str, np.ndarray]:
        return {"tokens": np.concatenate([self._bos, self._tok.encode(record["text"]), self._eos])}


def lm_features(tokens_R: np.ndarray, segment_ids_R: np.ndarray, positions_R: np.ndarray) -> dict[str, np.ndarray]:
    """Packed rows [..., R = T + 1] -> the model's [..., T] features (see the module docstring)."""
    seg_in_T, seg_out_T = segment_ids_R[..., :-1], segment_ids_R[..., 1:]
    return {
        "inputs": tokens_R[..., :-1].astype(np.int32),
        "targets": tokens_R[..., 1:].astype(np.int32),
        "segment_ids": seg_in_T.astype(np.int32),
        "positions": positions_R[..., :-1].astype(np.int32),
        "weights": ((seg_in_T != 0) & (seg_in_T == seg_out_T)).astype(np.float32),
    }


class _ToLM(grain.transforms.Map):
    def map(self, row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return lm_features(row["tokens"], row["tokens_segment_ids"], row["tokens_positions"])


class _RestoreSliceTuples(grain.IterDataset):
    """Passes its parent through; on `set_state`, turns JSON lists back into the packer's tuples.

    grain 0.2.18's ConcatThenSplit marks "no partial document" as the tuple (-1, -1) and compares
    with `!=`; a state that went through JSON (grain.checkpoint) has [-1, -1] there, and restoring it
    silently drops or misaligns tokens. Restoring tuples makes JSON-saved states resume exactly.
    """

    def __iter__(self) -> grain.DatasetIterator:
        return _RestoreSliceTuplesIterator(self._parent.__iter__())


class _RestoreSliceTuplesIterator(grain.DatasetIterator):
    def __next__(self) -> Any:
        return next(self._parent)

    def get_state(self) -> dict[str, Any]:
        return self._parent.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        slices = state.get("remainder_slices", {})
        self._parent.set_state({**state, "remainder_slices": {k: tuple(v) for k, v in slices.items()}})


def local_batch_size(global_batch_size: int, process_count: int) -> int:
    """Rows each process loads; the global batch must split evenly across processes."""
    if global_batch_size <= 0 or global_batch_size % process_count:
        raise ConfigError(f"train.batch_size={global_batch_size} must be a positive multiple of the "
                          f"process count ({process_count})")
    return global_batch_size // process_count


def _shuffle_seed(data_cfg: ml_collections.ConfigDict, seed: int) -> int:
    return int(np.random.SeedSequence([int(data_cfg.shuffle_seed), int(seed)]).generate_state(1)[0])


def _ensure_absl_flags_parsed() -> None:
    # grain's worker processes read absl flags; in a program not run under absl.app.run (a
    # notebook, pytest) they are unparsed and the workers fail. Parsing leaves defaults in place.
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def make_lm_dataset(data_cfg: ml_collections.ConfigDict, *, split: str, global_batch_size: int, seed: int,
                    process_index: int = 0, process_count: int = 1, shuffle: bool = True,
                    repeat: bool = True) -> grain.IterDataset:
    """The pipeline as a grain IterDataset of batches (see the module docstring)."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} must be in [0, process_count={process_count})")
    if int(data_cfg.seq_len) <= 0:
        raise ConfigError(f"data.seq_len={data_cfg.seq_len!r} must be a positive integer")
    if int(data_cfg.worker_count) < 0:
        raise ConfigError(f"data.worker_count={data_cfg.worker_count!r} must be >= 0")
    batch_B = local_batch_size(global_batch_size, process_count)
    tokenizer = tokenizers.get_tokenizer(data_cfg)
    if documents.uses_files(data_cfg):
        batches = packed.make_packed_dataset(
            token_cache.ensure_cache(data_cfg, tokenizer), files_split(data_cfg, split),
            seq_len=int(data_cfg.seq_len), global_batch_size=global_batch_size,
            seed=_shuffle_seed(data_cfg, seed), process_index=process_index, process_count=process_count,
            shuffle=shuffle, repeat=repeat, read_threads=_READ_THREADS, prefetch=_READ_PREFETCH)
        return _prefetch_workers(batches, data_cfg)
    source = corpus.load_split(data_cfg, split)

    docs = grain.MapDataset.source(source)[process_index::process_count]
    if len(docs) == 0:
        raise ConfigError(f"split {split!r} has {len(source)} records: none for process {process_index} "
                         f"of {process_count}")
    if shuffle:
        docs = docs.shuffle(seed=_shuffle_seed(data_cfg, seed))  # a new order every epoch
    if repeat:
        docs = docs.repeat()
    docs = docs.map(_Tokenize(tokenizer))
    rows = _RestoreSliceTuples(grain.experimental.ConcatThenSplitIterDataset(
        docs.to_iter_dataset(grain.ReadOptions(num_threads=_READ_THREADS, prefetch_buffer_size=_READ_PREFETCH)),
        length_struct={"tokens": int(data_cfg.seq_len) + 1},
    )).map(_ToLM())
    # A last, partial batch (repeat=False) is padded with all-zero rows (weights 0), keeping shapes fixed.
    batches = rows.batch(batch_B, batch_fn=functools.partial(grain.experimental.batch_and_pad, batch_size=batch_B))
    return _prefetch_workers(batches, data_cfg)


def _prefetch_workers(batches: grain.IterDataset, data_cfg: ml_collections.ConfigDict) -> grain.IterDataset:
    if int(data_cfg.worker_count) > 0:
        _ensure_absl_flags_parsed()
        batches = batches.mp_prefetch(grain.MultiprocessingOptions(num_workers=int(data_cfg.worker_count)))
    return batches


def files_split(data_cfg: ml_collections.ConfigDict, split: str) -> str:
    """The cache split ("train"/"eval") that `data.train_split` / `data.eval_split` name for local files."""
    if split == data_cfg.train_split:
        return "train"
    if split == data_cfg.eval_split:
        return "eval"
    raise ConfigError(f"split {split!r} is neither data.train_split={data_cfg.train_split!r} nor "
                      f"data.eval_split={data_cfg.eval_split!r}")


def make_lm_iterator(data_cfg: ml_collections.ConfigDict, *, split: str, global_batch_size: int, seed: int,
                     process_index: int = 0, process_count: int = 1, shuffle: bool = True,
                     repeat: bool = True) -> grain.DatasetIterator:
    """A checkpointable iterator (`get_state`/`set_state`) over this process's [B, T] LM batches.

    Each process reads records `process_index::process_count` of `split`; B = global_batch_size //
    process_count. `shuffle=False, repeat=False` (evaluation) yields the same batches on every call.
    """
    return iter(make_lm_dataset(data_cfg, split=split, global_batch_size=global_batch_size, seed=seed,
                                process_index=process_index, process_count=process_count,
                                shuffle=shuffle, repeat=repeat))


def unigram_entropy(data_cfg: ml_collections.ConfigDict, split: str, max_tokens: int = 1_000_000) -> float:
    """Entropy (nats/token) of the unigram distribution of the targets (tokens + eos) in `split`.

    A model that ignores context cannot do better than this loss; reads documents in order until
    `max_tokens` tokens.
    """
    tokenizer = tokenizers.get_tokenizer(data_cfg)
    counts_V = np.zeros(tokenizer.vocab_size, np.int64)
    if documents.uses_files(data_cfg):  # the cached documents (bos + ids + eos), bos left out
        cached = token_cache.open_split(token_cache.ensure_cache(data_cfg, tokenizer), files_split(data_cfg, split))
        n = min(max_tokens + len(cached.offsets), len(cached.tokens))
        is_bos_N = np.zeros(n, bool)
        is_bos_N[cached.offsets[cached.offsets < n]] = True
        ids_N = np.asarray(cached.tokens[:n])[~is_bos_N][:max_tokens]
        return float(scipy.stats.entropy(np.bincount(ids_N, minlength=tokenizer.vocab_size)))
    source = corpus.load_split(data_cfg, split)
    seen = 0
    for i in range(len(source)):
        ids_L = np.append(tokenizer.encode(source[i]["text"]), tokenizer.eos_id)[: max_tokens - seen]
        counts_V += np.bincount(ids_L, minlength=tokenizer.vocab_size)
        seen += len(ids_L)
        if seen >= max_tokens:
            break
    return float(scipy.stats.entropy(counts_V))
