"""Several runs of one shape trained at once: one compiled program, vmapped over a leading run axis.

Legend: R runs, B batch, T sequence.

Runs that share every shape (the learning rates of an LR scan, the seeds of a repeat) differ only in
numbers, so one program can train all R of them: the train state gets a leading run axis R and the
step is `jax.vmap` of the ordinary train step (transformer/training/steps.py). Small models use the
device far better this way (R× larger matmuls per dispatch, one compilation instead of R).

Per-run learning rates: the optimizer is built with peak learning rate 1 and a final
`scale_by_run_lr` stage whose state holds each run's peak rate. Every schedule in
optimizer.make_schedule is linear in the peak (warm-up from 0, decay to a fixed fraction), and AdamW's
update, weight decay included, is linear in the learning rate, so the result equals an optimizer built
with that peak (up to float32 rounding). Per-run seeds: each run's parameters are initialised from its
own seed; batches carry the run axis (R, B, T), so runs may see the same or different data.

Usage (an LR scan of one shape, sharing batches):
    tx = multirun.make_optimizer(config.train)
    states = multirun.init_states(model, tx, seeds=[0] * R, learning_rates=lrs, init_inputs=...)
    step = multirun.make_multi_train_step(model, task, tx)
    states, metrics_R = step(states, multirun.stack_batch(batch, R))   # metrics["loss"]: shape (R,)
The sweep runner still trains LR-scan runs one after another (each with its own workdir, checkpoints
and summary); this module is the building block for grouping them.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from transformer.tasks.base import Batch, Task
from transformer.training import optimizer, steps
from transformer.training.state import TrainState


class RunLR(NamedTuple):
    """Optimizer state of `scale_by_run_lr`: this run's peak learning rate (float32 scalar)."""
    learning_rate: jax.Array


def scale_by_run_lr() -> optax.GradientTransformation:
    """Multiplies the updates by the learning rate held in the state (1 until `init_states` sets it)."""

    def init(params: Any) -> RunLR:
        del params
        return RunLR(jnp.ones((), jnp.float32))

    def update(updates: Any, state: RunLR, params: Any = None) -> tuple[Any, RunLR]:
        del params
        return jax.tree.map(lambda u: u * state.learning_rate.astype(u.dtype), updates), state

    return optax.GradientTransformation(init, update)


def make_optimizer(train_cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """optimizer.make_optimizer of `train_cfg` with peak learning rate 1, then the per-run scale."""
    unit = train_cfg.copy_and_resolve_references()
    unit.learning_rate = 1.0
    return optax.chain(optimizer.make_optimizer(unit), scale_by_run_lr())


def init_states(model: nn.Module, tx: optax.GradientTransformation, *, seeds: Sequence[int],
                learning_rates: Sequence[float], init_inputs: tuple) -> TrainState:
    """R freshly initialised states stacked on a leading axis; run r has seed seeds[r] and peak
    learning rate learning_rates[r]. `tx` comes from `make_optimizer` (its last stage is the scale)."""
    if len(seeds) != len(learning_rates):
        raise ValueError(f"{len(seeds)} seeds but {len(learning_rates)} learning rates; give one of each per run")

    def init(rng: jax.Array) -> TrainState:
        params = nn.unbox(model.init(rng, *init_inputs)["params"])
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    states = jax.jit(jax.vmap(init))(jnp.stack([jax.random.PRNGKey(s) for s in seeds]))
    *inner, _ = states.opt_state
    lrs_R = jnp.asarray(learning_rates, jnp.float32)
    return states.replace(opt_state=(*inner, RunLR(lrs_R)))


def make_multi_train_step(model: nn.Module, task: Task, tx: optax.GradientTransformation, *, seed: int = 0,
                          use_dropout: bool = False, loss_chunk_size: int = 0,
                          donate: bool = True) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """jit(vmap(train step)): states with run axis R, batch arrays (R, B, ...) -> (states, metrics (R,))."""
    single = steps.make_train_step(model, task, tx, seed=seed, use_dropout=use_dropout,
                                   loss_chunk_size=loss_chunk_size)
    return jax.jit(jax.vmap(single), donate_argnums=0 if donate else ())


def make_multi_eval_step(model: nn.Module, task: Task) -> Callable[[Any, Batch], dict]:
    """jit(vmap(eval step)): params with run axis R, batch (R, B, ...) -> sums with shape (R,)."""
    return jax.jit(jax.vmap(steps.make_eval_step(model, task)))


def stack_batch(batch: dict, runs: int) -> dict:
    """One batch shared by all runs: each array repeated on a new leading run axis."""
    return {k: jnp.broadcast_to(jnp.asarray(v), (runs, *jnp.shape(v))) for k, v in batch.items()}


def unstack(tree: Any, run: int) -> Any:
    """Run `run`'s slice of a stacked pytree (state, params or metrics)."""
    return jax.tree.map(lambda x: x[run], tree)
