"""Numerical faults: which step went non-finite, which gradient tensor, and loss spikes.

The loop keeps each step's (loss, finite) device scalars since the last host sync and fetches them
together at the next log or checkpoint step, so detection is exact to the step at no per-step cost.
Under `train.nonfinite="stop"` the run then stops with `diagnose`'s report: it replays from the last
checkpoint (or from the initial state, before the first checkpoint) to the state before the bad step and
recomputes that batch's loss and gradients (not donated), naming the first non-finite tensor (`finding`): a
parameter already non-finite before the step, a gradient holding NaN/Inf (the first in tree order, and how many
do), or — every gradient finite — the global gradient norm overflowing float32 (the step's own test), with the
largest gradient's parameter. A replay that comes out finite says so plainly: the tensor could not be named.
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
            bad.append(_name(path))
    return bad


def _name(path: Any) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def _listed(names: list[str]) -> str:
    more = f" (and {len(names) - 1} more: {', '.join(names[1:4])}{', …' if len(names) > 4 else ''})"
    return names[0] + (more if len(names) > 1 else "")


def finding(params: Any, loss: Any, grads: Any) -> str | None:
    """The first non-finite tensor of a replayed step, in words, from the state's parameters before it and the
    recomputed loss and gradients (host or device arrays); None when everything is finite (not reproduced)."""
    bad = nonfinite_leaves(params)
    if bad:
        return f"the parameters were already non-finite before it: {_listed(bad)}"
    bad = nonfinite_leaves(grads)
    if bad:
        return f"first non-finite gradient: {_listed(bad)}"
    sq = {_name(p): float(np.sum(np.square(np.asarray(g, np.float64))))
          for p, g in jax.tree_util.tree_leaves_with_path(jax.device_get(grads))}
    norm = float(optax.tree.norm(grads))  # as the train step computes it (float32)
    if not np.isfinite(norm):
        worst = max(sq, key=sq.get)
        return (f"every gradient is finite, but their global norm overflows float32 (it is {np.sqrt(sum(sq.values())):.3g}"
                f"; the largest gradient, {worst}, has norm {np.sqrt(sq[worst]):.3g})")
    if not np.isfinite(float(loss)):
        return "the loss itself is non-finite, though every gradient is finite"
    return None


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


def describe(step: int, loss: float, found: str | None, replayed_from: int | None, replayed: bool = True) -> str:
    """The one-paragraph diagnosis of a non-finite step: `found` (finding()'s words), from a replay of the step
    from checkpoint `replayed_from` (None: from the initial state); `replayed` False: no replay was made."""
    msg = f"non-finite loss or gradient at step {step} (loss={loss})"
    origin = f"checkpoint {replayed_from}" if replayed_from is not None else "the initial state"
    if not replayed:
        msg += "; the step was not replayed, so the first non-finite tensor is not named"
    elif found is not None:
        msg += f"; {found} [replayed from {origin}]"
    else:
        msg += (f"; could not name the first non-finite tensor: replaying the step from {origin} gave a finite "
                f"loss and gradients")
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
