"""Batches addressed by a global index, and the checkpointable iterator over them.

Every training and evaluation pipeline is a grain MapDataset whose item s is this process's rows of
global batch s (by default rows [s·G + p·G/n, s·G + (p+1)·G/n) for process p of n, G the global batch;
under a mesh whose tensor or fsdp axis spans processes, the rows its devices hold: process_rows): the
global batch of a step depends on (config, seed, s) alone, never on the number of processes or devices.
The iterator's whole state is the next global batch index, `{"next_batch": s}`: the same in every
process, so a checkpoint written by any number of processes restores under any other.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import grain

from transformer.spec import ConfigError

READ_THREADS = 2   # threads computing batches ahead of the training step
PREFETCH = 4       # batches computed ahead (per iterator: a run's train iterator and its one eval iterator)


RowBlocks = tuple[tuple[int, int], ...]
"""The rows of each global batch a process feeds: sorted, disjoint [start, stop) blocks (its local batch is
their rows, concatenated in order)."""


def local_batch_size(global_batch_size: int, process_count: int) -> int:
    """Rows each process loads; the global batch must split evenly across processes."""
    if global_batch_size <= 0 or global_batch_size % process_count:
        raise ConfigError(f"train.batch_size={global_batch_size} must be a positive multiple of the "
                          f"process count ({process_count})")
    return global_batch_size // process_count


def default_rows(global_batch_size: int, process_index: int, process_count: int) -> RowBlocks:
    """Process p of n feeds rows [p·B, (p+1)·B), B = G/n: right when the batch axes split the processes'
    devices process by process (every mesh of a single process, and data parallelism across processes)."""
    B = local_batch_size(global_batch_size, process_count)
    return ((process_index * B, (process_index + 1) * B),)


def rows_from_indices(indices: Iterable[tuple[slice, ...]], global_batch_size: int) -> RowBlocks:
    """The row blocks covered by devices' index tuples (their first, batch dimension), merged and sorted:
    what a process must feed so that each of its devices finds its rows (jax.make_array_from_process_local_data
    maps a process's addressed slices, in order, onto its local data)."""
    spans = sorted({(i[0].indices(global_batch_size)[0], i[0].indices(global_batch_size)[1])
                    for i in indices} if indices else set())
    merged: list[list[int]] = []
    for start, stop in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return tuple((a, b) for a, b in merged)


def process_rows(batch_sharding: Any, global_shape: Sequence[int]) -> RowBlocks:
    """The rows of a [G, ...] global batch this process feeds under `batch_sharding` (a jax Sharding): the
    union of its addressable devices' rows. When a tensor or fsdp axis spans processes, replicas of one
    batch shard live in several processes, and each of them feeds those same rows."""
    shape = tuple(int(d) for d in global_shape)
    return rows_from_indices(list(batch_sharding.addressable_devices_indices_map(shape).values()), shape[0])


def row_count(rows: RowBlocks) -> int:
    return sum(b - a for a, b in rows)


def _ensure_absl_flags_parsed() -> None:
    # grain's worker processes read absl flags; in a program not run under absl.app.run (a
    # notebook, pytest) they are unparsed and the workers fail. Parsing leaves defaults in place.
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


class BatchIterator(grain.DatasetIterator):
    """Iterates `batches` (item s = this process's part of global batch s) from a global batch index on.

    `get_state()` is `{"next_batch": s}`; `set_state` restarts the reading at batch s (with `worker_count`
    grain worker processes, or threads in this process when 0). `split_tokens`: the tokens of the split
    the batches are packed from (None when they are not packed text), for the run's accounting;
    `eval_train_overlap_documents`: eval documents also in the train split (token_cache; None when unknown).
    """

    eval_train_overlap_documents: int | None = None

    def __init__(self, batches: grain.MapDataset, *, worker_count: int = 0, split_tokens: int | None = None):
        super().__init__()
        self._batches, self._workers, self.split_tokens = batches, int(worker_count), split_tokens
        self._next = 0
        self._it: Any = None  # opened on the first next(): a restore first sets the position

    def _open(self) -> None:
        ds = (self._batches[self._next:] if self._next else self._batches).to_iter_dataset(
            grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=PREFETCH))
        if self._workers > 0:
            _ensure_absl_flags_parsed()
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=self._workers))
        self._it = iter(ds)

    def __next__(self) -> dict:
        self._assert_not_closed()
        if self._it is None:
            self._open()
        batch = next(self._it)
        self._next += 1
        return batch

    def get_state(self) -> dict[str, int]:
        return {"next_batch": self._next}

    def set_state(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "next_batch" not in state:
            raise ValueError(f"data-iterator state {str(state)[:200]} is not a global batch index "
                             "({'next_batch': s}): it was written by an older version of this code, whose data "
                             "positions were per process; resume with that version or start a new workdir")
        self._close_reader()
        self._next = int(state["next_batch"])

    def _close_reader(self) -> None:
        if self._it is not None and hasattr(self._it, "close"):
            self._it.close()
        self._it = None

    def close(self) -> None:
        self._close_reader()
        super().close()

    def __repr__(self) -> str:
        return f"BatchIterator(next_batch={self._next}, {self._batches!r})"
