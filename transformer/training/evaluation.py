"""Evaluation: token-mean loss, accuracy and bits per byte over the first `train.eval_steps` batches of the
eval split (shuffled with a fixed seed so they sample the whole split, and the same batches every time)."""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from transformer.training.steps import global_batch


def evaluate(eval_fn: Callable, params: Any, task, config: Any, batch_sharding, process_index: int,
             process_count: int, token_bytes_V: np.ndarray | None = None) -> dict[str, Any]:
    """Token-mean loss and accuracy over the first `train.eval_steps` batches of the eval split, shuffled
    with a fixed seed so they sample the whole split (and are the same batches at every evaluation).

    `token_bytes_V` (the tokenizer's byte_lengths, for next-token prediction): also `eval_bits_per_byte`,
    the summed loss in bits over the UTF-8 bytes of the very targets it was taken on (each weighted
    target's byte length, summed over every process's rows), comparable across tokenizers.
    """
    it = task.make_iterator(config, split=config.data.eval_split, global_batch_size=config.train.batch_size,
                            seed=config.data.shuffle_seed, process_index=process_index,
                            process_count=process_count, shuffle=True, repeat=True)
    sums = {"loss_sum": 0.0, "weight_sum": 0.0, "correct_sum": 0.0}
    target_bytes = 0.0  # this process's rows
    try:
        for _ in range(config.train.eval_steps):
            local = next(it)
            if token_bytes_V is not None:
                target_bytes += float(np.sum(token_bytes_V[local["targets"]] * local["weights"], dtype=np.float64))
            out = jax.device_get(eval_fn(params, global_batch(local, batch_sharding)))
            for k in sums:
                sums[k] = sums[k] + np.asarray(out[k], np.float64)
    finally:
        if hasattr(it, "close"):  # its reader threads (or worker processes) end now
            it.close()
    n = np.maximum(sums["weight_sum"], 1.0)
    # floats; lists of R floats when eval_fn is a group's vmapped eval step (sums of shape (R,))
    result = {"eval_loss": (sums["loss_sum"] / n).tolist(), "eval_accuracy": (sums["correct_sum"] / n).tolist()}
    if token_bytes_V is not None:
        if process_count > 1:
            target_bytes = float(np.sum(multihost_utils.process_allgather(np.array([target_bytes]))))
        result["eval_bits_per_byte"] = (sums["loss_sum"] / (math.log(2) * max(target_bytes, 1.0))).tolist()
    return result
