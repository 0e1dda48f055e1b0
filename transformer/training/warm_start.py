"""Warm start: initialise a new run's parameters from another run's checkpoint (fine-tuning).

`train.init_from=DIR` (a finished or running train workdir): every parameter of the new model whose path
and shape also exist in DIR's latest checkpoint is copied, the rest (e.g. a classifier head replacing a
masked-LM head) keeps its fresh initialisation. The optimizer state starts fresh. Only used when the new
run has no checkpoint of its own; resuming always restores the run itself.
"""
from __future__ import annotations

from typing import Any

import jax

from transformer.spec import ConfigError
from transformer.training.state import TrainState


def warm_start(state: TrainState, init_from: str) -> tuple[TrainState, dict[str, list[str]]]:
    """Copies matching parameters from `init_from` into `state` (keeping each leaf's sharding).

    Returns the new state and {"copied": [...], "kept": [...]} parameter paths.
    """
    from transformer.training.restore import load_run  # reads DIR/config.json + the latest checkpoint

    try:
        source = load_run(init_from)
    except FileNotFoundError as e:
        raise ConfigError(f"train.init_from={init_from!r}: {e}") from None
    source_leaves = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(source.params)}
    report: dict[str, list[str]] = {"copied": [], "kept": []}

    def take(path: Any, leaf: jax.Array) -> jax.Array:
        key = jax.tree_util.keystr(path)
        src = source_leaves.get(key)
        if src is None or src.shape != leaf.shape:
            report["kept"].append(key)
            return leaf
        report["copied"].append(key)
        return jax.device_put(src.astype(leaf.dtype), leaf.sharding)

    params = jax.tree_util.tree_map_with_path(take, state.params)
    if not report["copied"]:
        raise ConfigError(f"train.init_from={init_from!r}: no parameter of this model matches that run's "
                          f"(path and shape); is it a run of the same family and width?")
    return state.replace(params=params), report
