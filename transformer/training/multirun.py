"""What a group of runs needs beyond one run (sweep.multirun): which runs may share one program (grouping.py's rule,
re-exported), and the leading run axis R that their stacked state, batches and shardings carry.

Runs that share every shape (the learning rates of an LR scan, the seeds of a repeat) differ only in
numbers: their parameters (seed) and the peak learning rate in their optimizer state
(optimizer.scale_by_peak_lr). Stacked on a leading axis they train as one compiled program, the ordinary
train step under `jax.vmap` (steps.jit_steps with `runs`). The loop (loop.train_runs) is the same for
R = 1 and R > 1; a group's run r is `unstack(state, r)`, in exactly the layout of a run trained alone.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from transformer.training.grouping import FREE_KEYS, group_key  # noqa: F401 (the rule; re-exported)


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
