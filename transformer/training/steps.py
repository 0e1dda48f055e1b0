"""The jitted train and eval steps: sharded inputs and outputs, the state donated.

What a batch holds and how the model consumes it is the task's business (transformer/tasks/); the
steps only see (logits, targets, weights) and a weighted cross-entropy.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from transformer.layers import lora
from transformer.tasks.base import Batch, Task
from transformer.training import multirun, sharding
from transformer.spec import ConfigError
from transformer.training.losses import chunked_cross_entropy, cross_entropy
from transformer.training.state import TrainState


def global_batch(local: dict[str, np.ndarray], batch_sharding: jax.sharding.Sharding,
                 global_rows: int | None = None) -> dict[str, jax.Array]:
    """Host-local rows (this process's rows, data.batches.process_rows) → one global array per key of
    `global_rows` rows (needed when processes hold replicas of the same rows; None: inferred)."""
    return {k: jax.make_array_from_process_local_data(
        batch_sharding, v, None if global_rows is None else (global_rows, *v.shape[1:])) for k, v in local.items()}


def module_name(path: tuple) -> str:
    """The module owning a parameter: its path without the parameter's own name ('blocks/layers_0/mlp/wi'
    for .../wi/kernel and .../wi/bias); a top-level parameter is its own module."""
    names = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    return "/".join(names[:-1] or names)


def module_rms(tree: Any) -> dict[str, jax.Array]:
    """Root mean square over each module's elements (all its parameters together), keyed by module_name."""
    sums: dict[str, jax.Array] = {}
    sizes: dict[str, int] = {}
    for path, x in jax.tree_util.tree_leaves_with_path(tree):
        module = module_name(path)
        sums[module] = sums.get(module, 0.0) + jnp.sum(jnp.square(x.astype(jnp.float32)))
        sizes[module] = sizes.get(module, 0) + x.size
    return {m: jnp.sqrt(sums[m] / max(sizes[m], 1)) for m in sums}


def make_loss_sums(model: nn.Module, task: Task, *, loss_chunk_size: int = 0
                   ) -> Callable[[Any, Batch, dict | None], tuple[jax.Array, jax.Array]]:
    """(params, batch, rngs) -> (loss_sum, weight_sum): the summed token cross-entropy of one batch and its
    token weight (rngs None: no dropout); under LoRA the frozen parameters are behind stop_gradient. loss_chunk_size > 0: from the task's final hidden states in sequence
    chunks of that many positions (losses.chunked_cross_entropy), for large vocabularies."""
    if loss_chunk_size and not hasattr(task, "forward_hidden"):
        raise ConfigError(f"train.loss_chunk_size={loss_chunk_size} needs a task with forward_hidden; "
                          f"task {task.name!r} has none (use 0)")

    def sums(params: Any, batch: Batch, rngs: dict | None) -> tuple[jax.Array, jax.Array]:
        params = lora.freeze(model.cfg, params)  # LoRA: no gradient (zeros) for the frozen base
        if loss_chunk_size:
            hidden, logits_fn, targets, weights = task.forward_hidden(
                model, params, batch, deterministic=rngs is None, rngs=rngs)
            return chunked_cross_entropy(hidden, logits_fn, targets, weights, loss_chunk_size)
        logits, targets, weights = task.forward(model, params, batch, deterministic=rngs is None, rngs=rngs)
        return cross_entropy(logits, targets, weights)

    return sums


def make_loss_fn(model: nn.Module, task: Task, *, seed: int, use_dropout: bool,
                 loss_chunk_size: int = 0) -> Callable[[Any, Batch, jax.Array], tuple[jax.Array, jax.Array]]:
    """(params, batch, step) -> (loss = weighted token mean, weight_sum): the training loss of a whole batch in
    one pass, dropout keyed by the step (make_loss_sums)."""
    sums = make_loss_sums(model, task, loss_chunk_size=loss_chunk_size)

    def loss_fn(params: Any, batch: Batch, step: jax.Array) -> tuple[jax.Array, jax.Array]:
        rngs = {"dropout": jax.random.fold_in(jax.random.PRNGKey(seed), step)} if use_dropout else None
        loss_sum, weight_sum = sums(params, batch, rngs)
        return loss_sum / jnp.maximum(weight_sum, 1.0), weight_sum

    return loss_fn


def micro_batches(batch: Batch, k: int) -> Batch:
    """Each (B, ...) array as (k, B/k, ...): micro-batch i holds rows i, k + i, 2k + i, ... A device's
    contiguous block of B/D rows (the batch sharding) then holds B/(D·k) rows of every micro-batch, so the split
    moves no data when (B/k) % D == 0 (spec.run checks it)."""
    return jax.tree.map(lambda x: jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1), batch)


def make_value_and_grad(model: nn.Module, task: Task, *, seed: int, use_dropout: bool, loss_chunk_size: int = 0,
                        grad_accum_steps: int = 1
                        ) -> Callable[[Any, Batch, jax.Array], tuple[tuple[jax.Array, jax.Array], Any]]:
    """(params, batch, step) -> ((loss, weight_sum), grads) of the batch's weighted token-mean loss.

    grad_accum_steps = k > 1 (gradient accumulation): a lax.scan over k micro-batches of B/k rows, each one
    forward and backward pass of the summed loss; the sums of losses, token weights and gradients are divided
    by the whole batch's token weight at the end. So the loss is the token mean over the whole batch (not a
    mean of micro-batch means, which differs when micro-batches hold different numbers of target tokens), the
    gradient is that loss's, and only one micro-batch's activations are live at a time. Dropout: micro-batch i
    folds i into the step's key."""
    k = int(grad_accum_steps)
    if k == 1:
        return jax.value_and_grad(make_loss_fn(model, task, seed=seed, use_dropout=use_dropout,
                                               loss_chunk_size=loss_chunk_size), has_aux=True)
    sums = make_loss_sums(model, task, loss_chunk_size=loss_chunk_size)
    grad_of_sums = jax.value_and_grad(sums, has_aux=True)

    def value_and_grad(params: Any, batch: Batch, step: jax.Array) -> tuple[tuple[jax.Array, jax.Array], Any]:
        key = jax.random.fold_in(jax.random.PRNGKey(seed), step)

        def micro_step(carry: tuple, xs: tuple) -> tuple[tuple, None]:
            micro, i = xs
            rngs = {"dropout": jax.random.fold_in(key, i)} if use_dropout else None
            (loss_sum, weight_sum), grads = grad_of_sums(params, micro, rngs)
            total = (loss_sum, weight_sum, grads)
            return jax.tree.map(jnp.add, carry, total), None

        zeros = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
        (loss_sum, weight_sum, grads), _ = jax.lax.scan(micro_step, zeros, (micro_batches(batch, k), jnp.arange(k)))
        scale = 1.0 / jnp.maximum(weight_sum, 1.0)
        return (loss_sum * scale, weight_sum), jax.tree.map(lambda g: (g * scale).astype(g.dtype), grads)

    return value_and_grad


def make_train_step(model: nn.Module, task: Task, tx: optax.GradientTransformation, *, seed: int,
                    use_dropout: bool, loss_chunk_size: int = 0, grad_accum_steps: int = 1
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """One optimizer update of the batch's weighted token-mean loss (make_value_and_grad: the whole batch, or
    `grad_accum_steps` micro-batches accumulated). Metrics: loss, grad_norm, tokens, finite, and rms:
    {"params" (after the update), "grads", "updates" (as applied, learning rate included): module_rms}."""

    value_and_grad = make_value_and_grad(model, task, seed=seed, use_dropout=use_dropout,
                                         loss_chunk_size=loss_chunk_size, grad_accum_steps=grad_accum_steps)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        (loss, weight_sum), grads = value_and_grad(state.params, batch, state.step)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "grad_norm": grad_norm, "tokens": weight_sum,
                   "finite": jnp.isfinite(loss) & jnp.isfinite(grad_norm),
                   # device scalars, fetched by the loop at log steps only
                   "rms": {"params": module_rms(params), "grads": module_rms(grads), "updates": module_rms(updates)}}
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(model: nn.Module, task: Task) -> Callable[[Any, Batch], dict]:
    """Sums over one batch of token losses, weights and correct argmax predictions."""

    def eval_step(params: Any, batch: Batch) -> dict:
        logits, targets, weights = task.forward(model, params, batch, deterministic=True, rngs=None)
        loss_sum, weight_sum = cross_entropy(logits, targets, weights)
        correct = jnp.sum((jnp.argmax(logits, -1) == targets) * weights.astype(jnp.float32))
        return {"loss_sum": loss_sum, "weight_sum": weight_sum, "correct_sum": correct}

    return eval_step


def jit_steps(train_step: Callable, eval_step: Callable, state_shardings: TrainState, mesh: Mesh,
              mesh_rules: Any, *, runs: int = 0) -> tuple[Callable, Callable]:
    """`jax.jit` both steps with explicit in/out shardings; the train state is donated.

    runs > 0: a group (multirun.py): the state and the train batch carry a leading run axis and the train
    step is vmapped over it; the eval step takes stacked params and one shared batch."""
    batch_s = sharding.batch_sharding(mesh, mesh_rules)
    rep = sharding.replicated(mesh)
    params_s = state_shardings.params
    if runs:
        train_step, eval_step = jax.vmap(train_step), jax.vmap(eval_step, in_axes=(0, None))
        state_shardings, params_s = multirun.with_run_axis(state_shardings), multirun.with_run_axis(params_s)
        train_batch_s = multirun.with_run_axis(batch_s)
    else:
        train_batch_s = batch_s
    train = jax.jit(train_step, in_shardings=(state_shardings, train_batch_s), out_shardings=(state_shardings, rep),
                    donate_argnums=0)
    evaluate = jax.jit(eval_step, in_shardings=(params_s, batch_s), out_shardings=rep)
    return train, evaluate
