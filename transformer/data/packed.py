"""Packed rows from the token cache, addressable by a global index.

The packed stream is the cache's documents (each bos + ids + eos) concatenated, epoch after epoch,
each epoch in its own seeded permutation (or in file order, unshuffled); row i is stream tokens
[i·R, (i+1)·R) with R = T + 1, computed by offset arithmetic alone. A document cut by a row boundary
continues in the next row as a new segment whose positions restart at 0 (as grain's ConcatThenSplit
packs in pipeline.py). Batch s of the global batch G is rows [s·G, (s+1)·G); process p of n reads
rows [s·G + p·G/n, s·G + (p+1)·G/n): the global batch of a step depends on (config, seed, s) alone.
A random per-row transform (BERT masking, span corruption) draws from a generator seeded by
(transform seed, global row index), so its result does not depend on the process count either.
"""
from __future__ import annotations

import collections
from typing import Callable

import grain
import numpy as np

from transformer.data import token_cache

_EPOCHS_KEPT = 2            # per-epoch permutations kept (a batch spans at most two epochs)
_REPEAT_BATCHES = 1 << 62   # "forever" as a grain source length


class PackedRows:
    """Rows of R tokens from one split of a cache (see the module docstring). Picklable (by path)."""

    def __init__(self, cache_path: str, split: str, row_len: int, seed: int, shuffle: bool, repeat: bool):
        self._args = (cache_path, split, row_len, seed, shuffle, repeat)
        self.split = token_cache.open_split(cache_path, split)
        self.row_len, self.seed, self.shuffle, self.repeat = row_len, seed, shuffle, repeat
        self.lengths_D = np.diff(self.split.offsets)
        self.total_tokens = int(self.split.offsets[-1])
        self.num_rows = -(-self.total_tokens // row_len)  # one pass, the last row padded
        self._epochs: collections.OrderedDict[int, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()

    def __getstate__(self) -> tuple:
        return self._args

    def __setstate__(self, args: tuple) -> None:
        self.__init__(*args)

    def _epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        """(documents in stream order [D], their stream ends within the epoch [D])."""
        found = self._epochs.get(e)  # read threads share this memo: never index it after an eviction
        if found is None:
            if self.shuffle:
                order = np.random.default_rng(np.random.SeedSequence([self.seed, e])).permutation(len(self.lengths_D))
            else:
                order = np.arange(len(self.lengths_D))
            found = self._epochs[e] = (order, np.cumsum(self.lengths_D[order]))
            while len(self._epochs) > _EPOCHS_KEPT:
                try:
                    self._epochs.popitem(last=False)
                except KeyError:  # another thread evicted it first
                    break
        return found

    def rows(self, first: int, count: int) -> dict[str, np.ndarray]:
        """Rows [first, first + count) as [count, R] tokens / segment_ids / positions (int32)."""
        R = self.row_len
        p_N = np.arange(first * R, (first + count) * R, dtype=np.int64)
        valid_N = np.ones_like(p_N, bool) if self.repeat else p_N < self.total_tokens
        epoch_N, q_N = np.divmod(p_N, self.total_tokens)
        tokens_N = np.zeros(len(p_N), np.int32)
        doc_N = np.zeros(len(p_N), np.int64)        # a unique id per document occurrence in the stream
        within_N = np.zeros(len(p_N), np.int64)     # position within that document
        for e in np.unique(epoch_N[valid_N]):
            sel = valid_N & (epoch_N == e)
            order, ends = self._epoch(int(e))
            k = np.searchsorted(ends, q_N[sel], side="right")
            within = q_N[sel] - (ends[k] - self.lengths_D[order[k]])
            tokens_N[sel] = self.split.tokens[self.split.offsets[order[k]] + within]
            doc_N[sel] = int(e) * len(order) + k
            within_N[sel] = within
        tokens_CR, doc_CR, within_CR = (a.reshape(count, R) for a in (tokens_N, doc_N, within_N))
        valid_CR = valid_N.reshape(count, R)
        new_CR = np.concatenate([np.ones((count, 1), bool), doc_CR[:, 1:] != doc_CR[:, :-1]], axis=1)
        segment_ids_CR = np.cumsum(new_CR, axis=1) * valid_CR
        positions_CR = (within_CR - np.where(segment_ids_CR == 1, within_CR[:, :1], 0)) * valid_CR
        return {"tokens": tokens_CR, "segment_ids": segment_ids_CR.astype(np.int32),
                "positions": positions_CR.astype(np.int32)}


RowTransform = Callable[[dict[str, np.ndarray], list[np.random.Generator]], dict[str, np.ndarray]]
"""(a batch's [B, T] LM features, one generator per row) -> the batch's features for the task."""


class PackedBatches:
    """A grain random-access source: item s = this process's [B, T] features of global batch s (the LM
    features, or what `transform` makes of them with row b's generator seeded by (transform_seed,
    global row index of b))."""

    def __init__(self, rows: PackedRows, global_batch_size: int, process_index: int, process_count: int,
                 transform: RowTransform | None = None, transform_seed: int = 0):
        from transformer.data.pipeline import lm_features  # the one definition of the features

        self._features = lm_features
        self.rows, self.G = rows, global_batch_size
        self.B = global_batch_size // process_count
        self.first = process_index * self.B
        self.transform, self.transform_seed = transform, transform_seed
        self._len = _REPEAT_BATCHES if rows.repeat else -(-rows.num_rows // global_batch_size)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, s: int) -> dict[str, np.ndarray]:
        first = int(s) * self.G + self.first
        r = self.rows.rows(first, self.B)
        features = self._features(r["tokens"], r["segment_ids"], r["positions"])
        if self.transform is None:
            return features
        rngs = [np.random.default_rng([self.transform_seed, first + b]) for b in range(self.B)]
        return self.transform(features, rngs)

    def __repr__(self) -> str:
        return f"PackedBatches({self.rows._args}, G={self.G}, B={self.B}, first={self.first})"


def make_packed_batches(cache_path: str, split: str, *, seq_len: int, global_batch_size: int, seed: int,
                        process_index: int, process_count: int, shuffle: bool, repeat: bool,
                        transform: RowTransform | None = None, transform_seed: int = 0) -> grain.MapDataset:
    """Batches from the cache as a grain MapDataset indexed by the global batch (batches.BatchIterator)."""
    rows = PackedRows(cache_path, split, seq_len + 1, seed, shuffle, repeat)
    return grain.MapDataset.source(PackedBatches(rows, global_batch_size, process_index, process_count,
                                                 transform, transform_seed))
