"""What a group of runs needs beyond one run (sweep.multirun): which runs may share one program, and the
leading run axis R that their stacked state, batches and shardings carry.

Runs that share every shape (the learning rates of an LR scan, the seeds of a repeat) differ only in
numbers: their parameters (seed) and the peak learning rate in their optimizer state
(optimizer.scale_by_peak_lr). Stacked on a leading axis they train as one compiled program, the ordinary
train step under `jax.vmap` (steps.jit_steps with `runs`). The loop (loop.train_runs) is the same for
R = 1 and R > 1; a group's run r is `unstack(state, r)`, in exactly the layout of a run trained alone.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

FREE_KEYS = ("learning_rate", "seed")  # the train.* settings in which a group's runs may differ


def group_key(config: Any) -> str | None:
    """Runs with the same key can train as one group; None: this run trains alone (dropout masks
    follow the step's one seed; warm starts are per run)."""
    c = json.loads(json.dumps(config.to_dict() if hasattr(config, "to_dict") else config))  # ConfigDict or dict
    if c["model"].get("dropout_rate", 0) or c["train"].get("init_from"):
        return None
    c["train"] = {k: v for k, v in c["train"].items() if k not in FREE_KEYS}
    return json.dumps(c, sort_keys=True)


class GroupMismatch(RuntimeError):
    """The runs' checkpoints are at different steps: they cannot continue as one group."""


def stack(trees: Sequence[Any]) -> Any:
    """R pytrees of one structure → one pytree with a leading run axis R."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def unstack(tree: Any, run: int) -> Any:
    """Run `run`'s slice of a stacked pytree (state, params or metrics)."""
    return jax.tree.map(lambda x: x[run], tree)


def take(tree: Any, runs: Sequence[int]) -> Any:
    """The stacked pytree restricted to `runs` (positions on the run axis), e.g. without a failed run."""
    index = jnp.asarray(runs, jnp.int32)
    return jax.tree.map(lambda x: x[index], tree)


def with_run_axis(shardings: Any) -> Any:
    """NamedShardings for arrays with a leading run axis: the run axis whole on every device."""
    return jax.tree.map(lambda s: NamedSharding(s.mesh, P(None, *s.spec)), shardings,
                        is_leaf=lambda x: isinstance(x, NamedSharding))
