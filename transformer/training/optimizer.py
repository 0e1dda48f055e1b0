"""AdamW with warm-up and decay, global-norm clipping and a weight-decay mask (optax).

One form for every run: the schedule is built for a peak learning rate of 1 and the last stage,
`scale_by_peak_lr`, multiplies the update by the run's peak rate, which its state holds. Every schedule
here is linear in the peak (warm-up from 0, decay to a fixed fraction) and AdamW's update, weight decay
included, is linear in the learning rate, so this equals AdamW built with that peak (up to float32
rounding). Because the peak is state, not program, the runs of an LR scan that share a shape differ only
in numbers: one compiled step trains them all (sweep.multirun), and a run's checkpoint has one layout
whether it trained alone or in a group.

Per-parameter learning-rate multipliers (μP's, transformer/layers/mup.py) are a stage inside AdamW, between
Adam's direction and the decoupled weight decay: they scale a parameter's Adam step but not its decay
(lr·wd per step stays the same, as in the `mup` package's MuAdamW). They are constants of the program,
the same for every run of a shape, so the peak learning rate stays the only per-run number in the state.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer.models.config import ConfigError

SCHEDULES = ("cosine", "linear", "constant", "wsd")
NONFINITE_POLICIES = ("stop", "skip")


AUTO_WARMUP = -1            # train.warmup_steps default: scales with the run (see warmup_steps)
AUTO_WARMUP_FRACTION = 0.1  # ... this fraction of train.steps,
AUTO_WARMUP_MAX = 100       # ... at most this many steps


def warmup_steps(train_cfg: Any) -> int:
    """train.warmup_steps, or with the default -1, min(100, 10% of train.steps): a shortened run
    (--config.train.steps=50) warms up for 5 steps instead of being refused. An explicit warm-up longer
    than the run stays an error (make_schedule)."""
    warmup = int(train_cfg.warmup_steps)
    if warmup == AUTO_WARMUP:
        return min(AUTO_WARMUP_MAX, int(AUTO_WARMUP_FRACTION * int(train_cfg.steps)))
    return warmup


def decay_start(train_cfg: Any) -> int | None:
    """The step where a warm-up–stable–decay ("wsd") schedule leaves its stable phase: train.steps −
    round(train.decay_fraction · train.steps); None for the other schedules. Up to this step a wsd run's
    learning rate does not depend on train.steps, so a run of S steps and one of S' > S steps are the same
    run until S's decay starts: the checkpoint there continues to S' (a longer run, or a sweep's branch)."""
    if train_cfg.schedule != "wsd":
        return None
    steps = int(train_cfg.steps)
    return steps - int(round(float(train_cfg.decay_fraction) * steps))


def make_schedule(train_cfg: Any, peak: float | None = None) -> optax.Schedule:
    """Linear warm-up from 0 to the peak (default `train.learning_rate`) over warmup_steps(train_cfg), then
    decay to `final_lr_fraction` of it at `steps`.

    cosine: half-cosine decay; linear: straight line; constant: flat after warm-up; wsd (warm-up–stable–
    decay, Hägele et al. 2024): flat until decay_start(), then the "1 − sqrt" cooldown over the last
    `train.decay_fraction` of the steps, lr = peak · (end + (1 − end) · (1 − sqrt(t / cooldown steps))).
    """
    if not float(train_cfg.learning_rate) > 0:
        raise ConfigError(f"train.learning_rate={train_cfg.learning_rate!r} must be positive")
    peak = float(train_cfg.learning_rate) if peak is None else float(peak)
    steps, warmup = int(train_cfg.steps), warmup_steps(train_cfg)
    if train_cfg.schedule not in SCHEDULES:
        raise ConfigError(f"train.schedule={train_cfg.schedule!r} is not valid; choose one of {', '.join(SCHEDULES)}")
    if not 0 <= warmup <= steps:
        raise ConfigError(f"train.warmup_steps={warmup} must be between 0 and train.steps={steps} (or -1, the "
                          f"default: min({AUTO_WARMUP_MAX}, {AUTO_WARMUP_FRACTION:.0%} of train.steps))")
    if not 0.0 <= train_cfg.final_lr_fraction <= 1.0:
        raise ConfigError(f"train.final_lr_fraction={train_cfg.final_lr_fraction!r} must be in [0, 1]")
    end = peak * float(train_cfg.final_lr_fraction)
    warm = optax.linear_schedule(0.0, peak, max(warmup, 1))
    decay_steps = max(steps - warmup, 1)
    if train_cfg.schedule == "wsd":
        if not 0.0 < float(train_cfg.decay_fraction) <= 1.0:
            raise ConfigError(f"train.decay_fraction={train_cfg.decay_fraction!r} must be in (0, 1] "
                              f"(the last fraction of train.steps spent decaying)")
        start = decay_start(train_cfg)
        if start < warmup:
            raise ConfigError(f"train.schedule='wsd': the warm-up ({warmup} steps) overlaps the decay, which starts "
                              f"at step {start} (train.decay_fraction={train_cfg.decay_fraction} of {steps}); "
                              f"shorten the warm-up or the decay")
        cool = max(steps - start, 1)
        cooldown = lambda t: end + (peak - end) * (1.0 - jnp.sqrt(jnp.clip(t / cool, 0.0, 1.0)))
        return optax.join_schedules([warm, optax.constant_schedule(peak), cooldown], [warmup, start])
    if train_cfg.schedule == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=end / peak)
    elif train_cfg.schedule == "linear":
        decay = optax.linear_schedule(peak, end, decay_steps)
    else:
        decay = optax.constant_schedule(peak)
    return optax.join_schedules([warm, decay], [warmup])


DECAYED = ("kernel", "embedding")


def decay_mask(params: Any) -> Any:
    """Weight decay on weight matrices and embeddings (leaves named "kernel"/"embedding") only; norm
    scales and biases are excluded, whatever their rank (an attention bias is (heads, head_dim))."""
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


def make_optimizer(train_cfg: Any, lr_multipliers: Any = None) -> optax.GradientTransformation:
    """clip(global norm) → AdamW(unit schedule, decay mask) → × the peak rate in the state (see the module
    docstring); `nonfinite="skip"` drops non-finite updates. `lr_multipliers`: a tree of floats shaped like the
    parameters (mup.lr_multipliers) that scales each parameter's Adam step; None: AdamW as optax.adamw."""
    if train_cfg.nonfinite not in NONFINITE_POLICIES:
        raise ConfigError(f"train.nonfinite={train_cfg.nonfinite!r} is not valid; "
                          f"choose one of {', '.join(NONFINITE_POLICIES)}")
    if train_cfg.grad_clip < 0:
        raise ConfigError(f"train.grad_clip={train_cfg.grad_clip!r} must be >= 0 (0 disables clipping)")
    tx = optax.chain(
        optax.clip_by_global_norm(train_cfg.grad_clip) if train_cfg.grad_clip > 0 else optax.identity(),
        optax.chain(  # optax.adamw's three stages, the multipliers (when given) after Adam's direction
            optax.scale_by_adam(b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps),
            *([] if lr_multipliers is None else [scale_by_multipliers(lr_multipliers)]),
            optax.add_decayed_weights(train_cfg.weight_decay, decay_mask),
            optax.scale_by_learning_rate(make_schedule(train_cfg, peak=1.0))),
        scale_by_peak_lr(float(train_cfg.learning_rate)),
    )
    if train_cfg.nonfinite == "skip":
        tx = optax.apply_if_finite(tx, max_consecutive_errors=1_000_000)
    return tx
