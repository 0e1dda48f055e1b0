"""Evaluation: token-mean loss, accuracy and bits per byte over the first `train.eval_steps` batches of the
eval split, shuffled with a fixed seed so they sample the whole split (and the same batches every time).

A run keeps ONE eval iterator (`Evaluator`): built at its first evaluation (finding and fingerprinting the
data once), rewound to its first batch at every later one. The per-batch sums stay on the device until the
evaluation's end, fetched together in one transfer and summed in float64 in batch order.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from transformer.training.steps import global_batch

SUMS = ("loss_sum", "weight_sum", "correct_sum")
# what an evaluation reports -> its row key: the run's own split (eval_loss, ...); a named set's are
# metric_keys.eval_set_keys(name) (eval/NAME/loss, ...)
OWN_KEYS = {"loss": "eval_loss", "accuracy": "eval_accuracy", "bits_per_byte": "eval_bits_per_byte"}


class Evaluator:
    """`evaluator(params)`: the run's evaluation (see the module docstring) with `eval_fn(params, batch) ->
    {loss_sum, weight_sum, correct_sum}` (scalars, or (R,) for a group's vmapped eval step).

    `token_bytes_V` (the tokenizer's byte_lengths, for next-token prediction): also `eval_bits_per_byte`, the
    summed loss in bits over the UTF-8 bytes of the very targets it was taken on (each weighted target's byte
    length, summed over every process's rows), comparable across tokenizers.

    `cache`: (token cache directory, split) of a named evaluation set (data/eval_sets.py) to read instead of the
    run's eval split; `keys`: what it reports under which row key (OWN_KEYS by default; a key left out is not
    reported)."""

    def __init__(self, eval_fn: Callable, task: Any, spec: Any, batch_sharding: Any, process_index: int,
                 process_count: int, token_bytes_V: np.ndarray | None = None, data: Any = None, rows: Any = None,
                 cache: tuple[str, str] | None = None, keys: dict[str, str] | None = None):
        # spec: the run's RunSpec (anything with .train and .data: spec.train.eval_steps, spec.data.eval_split)
        self.eval_fn, self.task, self.spec, self.batch_sharding = eval_fn, task, spec, batch_sharding
        self.data, self.rows = data, rows  # the run's resolved data (identity.RunData) and this process's rows
        self.cache, self.keys = cache, dict(OWN_KEYS if keys is None else keys)
        self.process_index, self.process_count, self.token_bytes_V = process_index, process_count, token_bytes_V
        self._it: Any = None
        self._start: Any = None
        self._target_bytes: float | None = None  # every process's, the same batches each time: counted once

    def _batches(self) -> Any:
        """The eval iterator at its first batch: made once, rewound (set_state) afterwards."""
        if self._it is None:
            c = self.spec
            self._it = self.task.make_iterator(c, split=c.data.eval_split, global_batch_size=c.train.batch_size,
                                               seed=c.data.shuffle_seed, process_index=self.process_index,
                                               process_count=self.process_count, shuffle=True, repeat=True,
                                               data=self.data, rows=self.rows,
                                               **({"cache": self.cache} if self.cache is not None else {}))
            self._start = self._it.get_state()
        else:
            self._it.set_state(self._start)
        return self._it

    def __call__(self, params: Any) -> dict[str, Any]:
        it = self._batches()
        outs = []  # device arrays: nothing is fetched until every batch is dispatched
        target_bytes = 0.0  # this process's rows
        for _ in range(self.spec.train.eval_steps):
            local = next(it)
            if self.token_bytes_V is not None and self._target_bytes is None:
                target_bytes += float(np.sum(self.token_bytes_V[local["targets"]] * local["weights"],
                                             dtype=np.float64))
            batch = global_batch(local, self.batch_sharding, self.spec.train.batch_size)
            outs.append({k: v for k, v in self.eval_fn(params, batch).items() if k in SUMS})
        sums = {k: 0.0 for k in SUMS}
        for out in jax.device_get(outs):
            for k in SUMS:
                sums[k] = sums[k] + np.asarray(out[k], np.float64)
        n = np.maximum(sums["weight_sum"], 1.0)
        # floats; lists of R floats when eval_fn is a group's vmapped eval step (sums of shape (R,))
        result = {"loss": (sums["loss_sum"] / n).tolist(), "accuracy": (sums["correct_sum"] / n).tolist()}
        if self.token_bytes_V is not None:
            if self._target_bytes is None:
                if self.process_count > 1:
                    target_bytes = float(np.sum(multihost_utils.process_allgather(np.array([target_bytes]))))
                self._target_bytes = target_bytes
            result["bits_per_byte"] = (sums["loss_sum"] / (math.log(2) * max(self._target_bytes, 1.0))).tolist()
        return {self.keys[k]: v for k, v in result.items() if k in self.keys}

    def close(self) -> None:
        """Ends the iterator's reader threads (or worker processes)."""
        if self._it is not None and hasattr(self._it, "close"):
            self._it.close()
        self._it = None
