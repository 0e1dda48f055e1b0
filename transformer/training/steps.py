"""The jitted train and eval steps: sharded inputs and outputs, the state donated.

Batch dict (global arrays, [B, T]): inputs, targets, segment_ids, positions (int32), weights (float32).
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from transformer.training import sharding
from transformer.training.losses import cross_entropy
from transformer.training.state import TrainState

Batch = dict[str, jax.Array]


def _logits(model: nn.Module, params: Any, batch: Batch, *, deterministic: bool, rng: jax.Array | None):
    rngs = {"dropout": rng} if rng is not None else None
    return model.apply({"params": params}, batch["inputs"], batch["positions"], batch["segment_ids"],
                       deterministic=deterministic, rngs=rngs)


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, *, seed: int,
                    use_dropout: bool) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """One optimizer update. Metrics: loss (token mean), grad_norm, finite (loss and grads)."""

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        rng = jax.random.fold_in(jax.random.PRNGKey(seed), state.step) if use_dropout else None

        def loss_fn(params):
            logits_BTV = _logits(model, params, batch, deterministic=not use_dropout, rng=rng)
            loss_sum, weight_sum = cross_entropy(logits_BTV, batch["targets"], batch["weights"])
            return loss_sum / jnp.maximum(weight_sum, 1.0), weight_sum

        (loss, weight_sum), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        grad_norm = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "grad_norm": grad_norm, "tokens": weight_sum,
                   "finite": jnp.isfinite(loss) & jnp.isfinite(grad_norm)}
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(model: nn.Module) -> Callable[[Any, Batch], dict]:
    """Sums of token losses and weights for one batch (accumulate, then divide)."""

    def eval_step(params: Any, batch: Batch) -> dict:
        logits_BTV = _logits(model, params, batch, deterministic=True, rng=None)
        loss_sum, weight_sum = cross_entropy(logits_BTV, batch["targets"], batch["weights"])
        return {"loss_sum": loss_sum, "weight_sum": weight_sum}

    return eval_step


def jit_steps(train_step: Callable, eval_step: Callable, state_shardings: TrainState, mesh: Mesh,
              mesh_rules: Any) -> tuple[Callable, Callable]:
    """`jax.jit` both steps with explicit in/out shardings; the train state is donated."""
    batch_s = sharding.batch_sharding(mesh, mesh_rules)
    rep = sharding.replicated(mesh)
    train = jax.jit(train_step, in_shardings=(state_shardings, batch_s), out_shardings=(state_shardings, rep),
                    donate_argnums=0)
    evaluate = jax.jit(eval_step, in_shardings=(state_shardings.params, batch_s), out_shardings=rep)
    return train, evaluate
