"""Packed rows from the token cache, addressable by a global index.

The packed stream is the cache's documents (each bos + ids + eos) concatenated, epoch after epoch,
each epoch in its own seeded permutation (or in file order, unshuffled); stream row i is stream tokens
[i·R, (i+1)·R) with R = T + 1, computed by offset arithmetic alone. A document cut by a row boundary
continues in the next row as a new segment whose positions restart at 0. Shuffled, the rows are read in a
seeded order too, block by block (PackedRows.rows), so a batch mixes rows from all over the corpus. Batch s
of the global batch G is read rows [s·G, (s+1)·G); a process reads its rows of it (batches.RowBlocks; by
default process p of n reads rows [s·G + p·G/n, s·G + (p+1)·G/n)): the global batch of a step depends on
(config, seed, s) alone.
A random per-row transform (BERT masking, span corruption) draws from a generator seeded by
(transform seed, global row index), so its result does not depend on the process count either.
"""
from __future__ import annotations

import collections
from typing import Callable

import grain
import numpy as np

from transformer.data import token_cache
from transformer.data.batches import RowBlocks, row_count

_EPOCHS_KEPT = 2            # per-epoch permutations kept (a batch spans at most two epochs)
_REPEAT_BATCHES = 1 << 62   # "forever" as a grain source length
_ROW_SALT = 0x524F5753      # separates the row orders' seeds from the document orders'


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
        self._blocks: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()

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

    def _pieces(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The document pieces that make up stream tokens [start, stop), in order, as arrays [P]: a unique id
        per document occurrence, its first token's index in the cache, its length. Two searches per epoch
        crossed, whatever the number of tokens."""
        occurrence, source, length = [], [], []
        p, S, D = start, self.total_tokens, len(self.lengths_D)
        while p < stop:
            e, q = divmod(p, S)
            q_stop = min(S, q + stop - p)
            order, ends = self._epoch(e)
            k_P = np.arange(np.searchsorted(ends, q, side="right"), np.searchsorted(ends, q_stop - 1, side="right") + 1)
            doc_P = order[k_P]
            doc_start_P = ends[k_P] - self.lengths_D[doc_P]
            lo_P, hi_P = np.maximum(doc_start_P, q), np.minimum(ends[k_P], q_stop)
            occurrence.append(e * D + k_P)
            source.append(self.split.offsets[doc_P] + lo_P - doc_start_P)
            length.append(hi_P - lo_P)
            p += q_stop - q
        return tuple(np.concatenate(a) if a else np.zeros(0, np.int64) for a in (occurrence, source, length))

    def _row_block(self, b: int) -> np.ndarray:
        """The order in which block b of the stream's rows (rows [b·M, (b + 1)·M), M = num_rows) is read."""
        found = self._blocks.get(b)
        if found is None:
            found = self._blocks[b] = np.random.default_rng(
                np.random.SeedSequence([self.seed, _ROW_SALT, b])).permutation(self.num_rows)
            while len(self._blocks) > _EPOCHS_KEPT:
                try:
                    self._blocks.popitem(last=False)
                except KeyError:
                    break
        return found

    def rows(self, first: int, count: int) -> dict[str, np.ndarray]:
        """Rows [first, first + count) of the read order as [count, R] tokens / segment_ids / positions (int32).

        Shuffled, read row g is stream row b·M + perm_b[g − b·M] (b = g // M, M = num_rows, perm_b seeded by
        (seed, b)): each block of M rows is read once, in its own order, so the rows of one batch come from
        all over the corpus (consecutive stream rows would mostly be one document: a batch of 8 rows of 129
        bytes is ~1 kB of one file). Unshuffled, read row g is stream row g."""
        if not self.shuffle:
            return self._stream_rows(first, count)
        g = np.arange(first, first + count)
        stream = [int(b) * self.num_rows + int(self._row_block(int(b))[p]) for b, p in zip(*np.divmod(g, self.num_rows))]
        parts = [self._stream_rows(r, 1) for r in stream]
        return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}

    def _stream_rows(self, first: int, count: int) -> dict[str, np.ndarray]:
        """Stream rows [first, first + count) as [count, R] tokens / segment_ids / positions (int32)."""
        R = self.row_len
        start = first * R
        stop = (first + count) * R if self.repeat else min((first + count) * R, self.total_tokens)
        occurrence_P, source_P, length_P = self._pieces(start, max(start, stop))
        n = int(length_P.sum())  # the real tokens; the rest (one pass, past its end) is padding
        piece_start_P = np.cumsum(length_P) - length_P
        i_N = np.arange(n, dtype=np.int64)
        tokens_N, doc_N, within_N = (np.zeros(count * R, np.int64) for _ in range(3))
        tokens_N[:n] = self.split.tokens[i_N + np.repeat(source_P - piece_start_P, length_P)]
        doc_N[:n] = np.repeat(occurrence_P, length_P)          # a document occurrence's id
        within_N[:n] = i_N - np.repeat(piece_start_P, length_P)  # position within its piece of the read
        tokens_CR, doc_CR, within_CR = (a.reshape(count, R) for a in (tokens_N, doc_N, within_N))
        valid_CR = (np.arange(count * R) < n).reshape(count, R)
        new_CR = np.concatenate([np.ones((count, 1), bool), doc_CR[:, 1:] != doc_CR[:, :-1]], axis=1)
        segment_ids_CR = np.cumsum(new_CR, axis=1) * valid_CR
        # only a row's first segment can continue a document (the others start at its bos): restart it at 0
        positions_CR = (within_CR - np.where(segment_ids_CR == 1, within_CR[:, :1], 0)) * valid_CR
        return {"tokens": tokens_CR.astype(np.int32), "segment_ids": segment_ids_CR.astype(np.int32),
                "positions": positions_CR.astype(np.int32)}


def lm_features(tokens_R: np.ndarray, segment_ids_R: np.ndarray, positions_R: np.ndarray) -> dict[str, np.ndarray]:
    """Packed rows [..., R = T + 1] -> the model's [..., T] features: inputs, targets (the next token),
    segment_ids, positions (int32) and weights (float32, 1 where the target is the next token of the same
    document; transformer/data/pipeline.py describes them)."""
    seg_in_T, seg_out_T = segment_ids_R[..., :-1], segment_ids_R[..., 1:]
    return {
        "inputs": tokens_R[..., :-1].astype(np.int32),
        "targets": tokens_R[..., 1:].astype(np.int32),
        "segment_ids": seg_in_T.astype(np.int32),
        "positions": positions_R[..., :-1].astype(np.int32),
        "weights": ((seg_in_T != 0) & (seg_in_T == seg_out_T)).astype(np.float32),
    }


RowTransform = Callable[[dict[str, np.ndarray], list[np.random.Generator]], dict[str, np.ndarray]]
"""(a batch's [B, T] LM features, one generator per row) -> the batch's features for the task."""


class PackedBatches:
    """A grain random-access source: item s = this process's [B, T] features of global batch s, its rows
    `row_blocks` (batches.RowBlocks: [start, stop) within a global batch) concatenated (the LM features, or
    what `transform` makes of them with row b's generator seeded by (transform_seed, global row index of b))."""

    def __init__(self, rows: PackedRows, global_batch_size: int, row_blocks: RowBlocks,
                 transform: RowTransform | None = None, transform_seed: int = 0):
        self.rows, self.G, self.blocks = rows, global_batch_size, tuple(row_blocks)
        self.B = row_count(self.blocks)
        self.transform, self.transform_seed = transform, transform_seed
        self._len = _REPEAT_BATCHES if rows.repeat else -(-rows.num_rows // global_batch_size)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, s: int) -> dict[str, np.ndarray]:
        base = int(s) * self.G
        parts = [self.rows.rows(base + a, b - a) for a, b in self.blocks]
        r = parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        features = lm_features(r["tokens"], r["segment_ids"], r["positions"])
        if self.transform is None:
            return features
        rngs = [np.random.default_rng([self.transform_seed, base + g]) for a, b in self.blocks for g in range(a, b)]
        return self.transform(features, rngs)

    def __repr__(self) -> str:
        return f"PackedBatches({self.rows._args}, G={self.G}, rows={self.blocks})"


def make_packed_batches(cache_path: str, split: str, *, seq_len: int, global_batch_size: int, seed: int,
                        row_blocks: RowBlocks, shuffle: bool, repeat: bool,
                        transform: RowTransform | None = None, transform_seed: int = 0) -> grain.MapDataset:
    """Batches from the cache as a grain MapDataset indexed by the global batch (batches.BatchIterator)."""
    rows = PackedRows(cache_path, split, seq_len + 1, seed, shuffle, repeat)
    return grain.MapDataset.source(PackedBatches(rows, global_batch_size, row_blocks, transform, transform_seed))
