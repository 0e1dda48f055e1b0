"""Numerical faults: which step went non-finite, which gradient tensor, and loss spikes.

The loop keeps each step's (loss, finite) device scalars since the last host sync and fetches them
together at the next log or checkpoint step, so detection is exact to the step at no per-step cost.
Under `train.nonfinite="stop"` the run then stops with `diagnose`'s report: it replays from the last
checkpoint to the state before the bad step and recomputes that batch's gradients (not donated), naming
the first parameter whose gradient holds NaN/Inf (in tree order) and how many do.
"""
from __future__ import annotations

import statistics
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
import optax

from transformer.training import steps

SPIKE_FACTOR = 2.0     # a step's loss above this multiple of the reference is a spike
SPIKE_HISTORY = 20     # the reference: the median train_loss of up to this many previous logged rows
SPIKE_MIN_HISTORY = 3  # no judgement before this many rows


class NonFiniteError(FloatingPointError):
    """A non-finite loss or gradient under train.nonfinite='stop'; the message is the diagnosis."""


def first_bad(window: Sequence[tuple[int, dict]]) -> tuple[int, float] | None:
    """(step, loss) of the first step in a fetched window [(step, {"loss", "finite"})] that was not finite."""
    for step, m in window:
        if not bool(m["finite"]):
            return step, float(m["loss"])
    return None


def skipped_updates(opt_state: Any) -> int | list[int] | None:
    """Updates optax.apply_if_finite has dropped so far (it is checkpointed with the state), or None
    when the optimizer does not skip (its state holds no ApplyIfFiniteState: optimizer.make_optimizer)."""
    is_guard = lambda x: isinstance(x, optax.ApplyIfFiniteState)  # noqa: E731
    for state in jax.tree.leaves(opt_state, is_leaf=is_guard):
        if is_guard(state):
            n = jax.device_get(state.total_notfinite)
            return int(n) if np.ndim(n) == 0 else [int(x) for x in n]  # a list for a group's stacked state
    return None


def nonfinite_leaves(tree: Any) -> list[str]:
    """Paths ('blocks_0/attn/q/kernel') of the leaves holding a NaN or Inf, in tree order."""
    bad = []
    for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(tree)):
        if not np.all(np.isfinite(np.asarray(leaf))):
            bad.append("/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path))
    return bad


def make_grad_fn(model: nn.Module, task: Any, *, seed: int, use_dropout: bool, loss_chunk_size: int = 0,
                 grad_accum_steps: int = 1):
    """jit((params, batch, step) -> (loss, grads)): the train step's own loss and gradients
    (steps.make_value_and_grad, its micro-batches too), nothing donated."""
    value_and_grad = steps.make_value_and_grad(model, task, seed=seed, use_dropout=use_dropout,
                                               loss_chunk_size=loss_chunk_size, grad_accum_steps=grad_accum_steps)

    def grad_fn(params: Any, batch: dict, step: jax.Array) -> tuple[jax.Array, Any]:
        (loss, _), grads = value_and_grad(params, batch, step)
        return loss, grads

    return jax.jit(grad_fn)


def describe(step: int, loss: float, bad_leaves: list[str] | None, replayed_from: int | None) -> str:
    """The one-paragraph diagnosis of a non-finite step."""
    msg = f"non-finite loss or gradient at step {step} (loss={loss})"
    if bad_leaves is None:
        msg += "; the gradients could not be recomputed"
    elif bad_leaves:
        more = f" (and {len(bad_leaves) - 1} more: {', '.join(bad_leaves[1:4])}{', …' if len(bad_leaves) > 4 else ''})"
        msg += f"; first non-finite gradient: {bad_leaves[0]}{more if len(bad_leaves) > 1 else ''}"
    else:
        msg += "; recomputing that batch's gradients gave finite values (not reproducible: a hardware or " \
               "non-deterministic fault?)"
    if replayed_from is not None:
        msg += f" [replayed from checkpoint {replayed_from}]"
    return msg + ". Lower train.learning_rate or raise train.warmup_steps, or set train.nonfinite='skip' " \
                 "to drop such updates"


class SpikeDetector:
    """Flags a logged window whose largest step loss exceeds SPIKE_FACTOR × the median train_loss of the
    previous logged rows (restored from metrics.jsonl on resume, so a resumed run flags the same rows)."""

    def __init__(self, previous_losses: Sequence[float]):
        self.history = [x for x in previous_losses if x is not None][-SPIKE_HISTORY:]

    def check(self, window: Sequence[tuple[int, dict]], logged_loss: float) -> tuple[int, float] | None:
        """(step, ratio) of the worst spike in the window, or None; then records `logged_loss`."""
        found = None
        if len(self.history) >= SPIKE_MIN_HISTORY:
            reference = statistics.median(self.history)
            finite = [(s, float(m["loss"])) for s, m in window if np.isfinite(float(m["loss"]))]
            if finite and reference > 0:
                step, worst = max(finite, key=lambda x: x[1])
                if worst > SPIKE_FACTOR * reference:
                    found = (step, worst / reference)
        if np.isfinite(logged_loss):
            self.history = (self.history + [logged_loss])[-SPIKE_HISTORY:]
        return found
