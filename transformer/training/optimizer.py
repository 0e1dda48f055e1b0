"""AdamW with warm-up and decay, global-norm clipping and a weight-decay mask (optax).

One form for every run: the schedule is built for a peak learning rate of 1 and the last stage,
`scale_by_peak_lr`, multiplies the update by the run's peak rate, which its state holds. Every schedule
here is linear in the peak (warm-up from peak/warmup, decay to a fixed fraction) and AdamW's update, weight decay
included, is linear in the learning rate, so this equals AdamW built with that peak (up to float32
rounding). Because the peak is state, not program, the runs of an LR scan that share a shape differ only
in numbers: one compiled step trains them all (sweep.multirun), and a run's checkpoint has one layout
whether it trained alone or in a group.

Per-parameter learning-rate multipliers (μP's, transformer/layers/mup.py) are a stage inside AdamW, between
Adam's direction and the decoupled weight decay: they scale a parameter's Adam step but not its decay
(lr·wd per step stays the same, as in the `mup` package's MuAdamW). They are constants of the program,
the same for every run of a shape, so the peak learning rate stays the only per-run number in the state.

The schedule is spec.schedule.lr_at (warm-up from peak/warmup at step 1, so no step trains at rate 0), evaluated
on the update count, which is the train step under either non-finite policy (make_optimizer).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer.spec import (AUTO_WARMUP, AUTO_WARMUP_FRACTION, AUTO_WARMUP_MAX, NONFINITE_POLICIES,  # noqa: F401
                              SCHEDULES, TrainSpec, decay_start, warmup_steps)


def make_schedule(train_cfg: TrainSpec | Any, peak: float | None = None) -> optax.Schedule:
    """count -> learning rate: spec.schedule.lr_at with jax.numpy (the one learning-rate arithmetic; see
    transformer/spec/schedule.py), for the peak `peak` (default train.learning_rate). `train_cfg`: a
    TrainSpec or the config's train block (checked: ConfigError naming the setting)."""
    spec = TrainSpec.from_config(train_cfg)
    return lambda count: spec.lr_at(count, peak=peak, xp=jnp)


DECAYED = ("kernel", "embedding", "lora_a", "lora_b")


def decay_mask(params: Any) -> Any:
    """Weight decay on weight matrices and embeddings (leaves named "kernel"/"embedding", and LoRA's adapter
    matrices) only; norm scales and biases are excluded, whatever their rank (an attention bias is (heads,
    head_dim))."""
    return jax.tree_util.tree_map_with_path(lambda path, _: getattr(path[-1], "key", None) in DECAYED, params)


class PeakLR(NamedTuple):
    """Optimizer state of `scale_by_peak_lr`: the run's peak learning rate (float32 scalar)."""
    learning_rate: jax.Array


def scale_by_peak_lr(peak: float) -> optax.GradientTransformation:
    """Multiplies the updates by the peak learning rate held in the state (initialised to `peak`)."""

    def init(params: Any) -> PeakLR:
        del params
        return PeakLR(jnp.asarray(peak, jnp.float32))

    def update(updates: Any, state: PeakLR, params: Any = None) -> tuple[Any, PeakLR]:
        del params
        return jax.tree.map(lambda u: u * state.learning_rate.astype(u.dtype), updates), state

    return optax.GradientTransformation(init, update)


def with_peak_lrs(opt_state: Any, learning_rates: Sequence[float] | float) -> Any:
    """`opt_state` with its PeakLR set to `learning_rates` (a float, or one per run of a stacked state)."""
    lr = np.asarray(learning_rates, np.float32)

    def replace(x: Any) -> Any:
        if not isinstance(x, PeakLR):
            return x
        sharding = getattr(x.learning_rate, "sharding", None)  # keep the state's placement (multi-process too)
        same = sharding is not None and np.shape(x.learning_rate) == lr.shape
        return PeakLR(jax.device_put(lr, sharding) if same else jnp.asarray(lr))

    return jax.tree.map(replace, opt_state, is_leaf=lambda x: isinstance(x, PeakLR))


def scale_by_multipliers(multipliers: Any) -> optax.GradientTransformation:
    """Multiplies each update by its parameter's constant (a tree of floats shaped like the parameters)."""

    def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
        del params
        return jax.tree.map(lambda u, m: u * jnp.asarray(m, u.dtype), updates, multipliers), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(train_cfg: TrainSpec | Any, lr_multipliers: Any = None,
                   trained: Callable[[Any], Any] | None = None) -> optax.GradientTransformation:
    """clip(global norm) → AdamW(unit schedule, decay mask) → × the peak rate in the state (see the module
    docstring). `lr_multipliers`: a tree of floats shaped like the parameters (mup.lr_multipliers) that scales
    each parameter's Adam step; None: AdamW as optax.adamw. `trained`: params → a tree of bools (LoRA:
    layers/lora.trained_mask); the optimizer then sees only those parameters (optax.multi_transform: clipping,
    Adam's moments and weight decay over them alone, no state at all for the others, whose update is zero).

    `nonfinite="skip"` drops non-finite updates: optax.apply_if_finite wraps clipping, Adam and the weight
    decay, and the schedule stage comes after it, so the schedule's count advances on a dropped update too and
    stays the train step (the rate the log shows is the rate used). "stop" keeps the one chain (its optimizer
    state, and so its checkpoints, are laid out as before)."""
    t = TrainSpec.from_config(train_cfg)  # checks schedule, learning rate, warm-up, clipping, nonfinite policy
    clip = optax.clip_by_global_norm(t.grad_clip) if t.grad_clip > 0 else optax.identity()
    adamw = [optax.scale_by_adam(b1=t.b1, b2=t.b2, eps=t.eps),  # optax.adamw's stages, μP's multipliers inside
             *([] if lr_multipliers is None else [scale_by_multipliers(lr_multipliers)]),
             optax.add_decayed_weights(t.weight_decay, decay_mask)]
    schedule = optax.scale_by_learning_rate(make_schedule(t, peak=1.0))
    if t.nonfinite == "skip":
        guarded = optax.apply_if_finite(optax.chain(clip, optax.chain(*adamw)), max_consecutive_errors=1_000_000)
        tx = optax.chain(guarded, schedule, scale_by_peak_lr(float(t.learning_rate)))
    else:
        tx = optax.chain(clip, optax.chain(*adamw, schedule), scale_by_peak_lr(float(t.learning_rate)))
    if trained is None:
        return tx
    labels = lambda params: jax.tree.map(lambda on: "trained" if on else "frozen", trained(params))  # noqa: E731
    return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)
