"""Warm start: initialise a new run's parameters from another run's checkpoint (fine-tuning).

`train.init_from=DIR` (a finished or running train workdir): every parameter of the new model whose path
and shape also exist in DIR's latest checkpoint is copied, the rest (e.g. a classifier head replacing a
masked-LM head) keeps its fresh initialisation. The optimizer state starts fresh. Only used when the new
run has no checkpoint of its own; resuming always restores the run itself.

The copied parameters are restored straight into the new state's shardings (an orbax partial restore of
only the matching leaves, as the checkpointer restores a run): each device reads its own shards, and no
parameter is ever whole on one device.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from transformer.spec import ConfigError
from transformer.training.restore import latest_step, load_config
from transformer.training.state import TrainState


def _leaves(tree: Any) -> dict[str, Any]:
    """keystr(path) → leaf, for a tree of arrays or of orbax's array metadata."""
    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _pruned(tree: Any) -> Any:
    """A nested mapping without its None leaves and the subtrees left empty (None when nothing is left)."""
    if not isinstance(tree, Mapping):
        return tree
    kept = {k: _pruned(v) for k, v in tree.items()}
    return {k: v for k, v in kept.items() if v is not None} or None


def warm_start(state: TrainState, init_from: str) -> tuple[TrainState, dict[str, list[str]]]:
    """Copies matching parameters from `init_from` into `state`, each restored in that leaf's sharding and
    dtype. Returns the new state and {"copied": [...], "kept": [...]} parameter paths.
    """
    try:
        load_config(init_from)  # DIR/config.json: it is a training run
        state_dir = os.path.join(init_from, "checkpoints", str(latest_step(init_from)), "state")
    except FileNotFoundError as e:
        raise ConfigError(f"train.init_from={init_from!r}: {e}") from None
    saved = ocp.PyTreeCheckpointHandler().metadata(epath.Path(state_dir))
    saved_params = _leaves(saved["params"] if isinstance(saved, dict) else saved.tree["params"])
    report: dict[str, list[str]] = {"copied": [], "kept": []}

    def wanted(path: Any, leaf: jax.Array) -> jax.ShapeDtypeStruct | None:
        key = jax.tree_util.keystr(path)
        src = saved_params.get(key)
        if src is None or tuple(src.shape) != tuple(leaf.shape):
            report["kept"].append(key)
            return None
        report["copied"].append(key)
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)

    item = _pruned(jax.tree_util.tree_map_with_path(wanted, state.params))  # only the leaves to copy
    if not report["copied"]:
        raise ConfigError(f"train.init_from={init_from!r}: no parameter of this model matches that run's "
                          f"(path and shape); is it a run of the same family and width?")
    item = {"params": item}
    restored = ocp.PyTreeCheckpointer().restore(state_dir, args=ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True))
    copied = _leaves(restored["params"])
    params = jax.tree_util.tree_map_with_path(lambda p, x: copied.get(jax.tree_util.keystr(p), x), state.params)
    return state.replace(params=params), report
