"""The train.* settings as one frozen, checked dataclass, and the one learning-rate arithmetic (numpy or jax.numpy).

`lr_at(count, ...)` is the rate of the update made after `count` earlier updates, i.e. of training step
count + 1. The optimizer (training/optimizer.py, with xp=jax.numpy inside the compiled step) and the logger
(the metrics row's learning_rate, through optimizer.make_schedule) both evaluate it; nothing else computes one.

Every rate is a function of the step s = count + 1 that it trains. Warm-up is linear and starts above 0:
step 1 trains at peak / warmup, step `warmup` at the peak (so no step is spent at learning rate 0). Then the
decay, which reaches `final_lr_fraction` of the peak at the last step s = `steps` (a step that trains): cosine
(half-cosine), linear (straight line), constant (flat), or wsd (warm-up–stable–decay, Hägele et al. 2024: flat
through step decay_start, then the "1 − sqrt" cooldown over the last `decay_fraction` of the steps,
lr = end + (peak − end)·(1 − sqrt(k / cooldown steps)) at its k-th step, k = 1 .. cooldown steps).

LR_ARITHMETIC names this arithmetic; checkpoints record it (training/checkpointing.py), so a run resumed from a
checkpoint written under the earlier one (whose decay ran one step behind: its last step trained above
final_lr_fraction) is told that its remaining steps follow this one.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Mapping

import numpy as np

from transformer.spec.errors import ConfigError, check_choice, check_positive_int
from transformer.spec.model import COMPUTE_DTYPES

SCHEDULES = ("cosine", "linear", "constant", "wsd")
NONFINITE_POLICIES = ("stop", "skip")
LR_ARITHMETIC = 2  # 1: the decay one step behind (count, not step); 2: the last step trains at final_lr_fraction
MAX_SKIPPED_FRACTION = 0.1  # train.max_skipped_fraction's default: a skip run that drops more updates fails
# train.* keys added after runs were recorded, with the values earlier runs had: a sweep run's id leaves such a key
# out at this value (design/grid.run_id), so adding a setting does not rename every recorded run
ADDED_TRAIN_KEYS = {"grad_accum_steps": 1, "max_skipped_fraction": MAX_SKIPPED_FRACTION}

AUTO_WARMUP = -1            # train.warmup_steps default: scales with the run (see warmup_steps)
AUTO_WARMUP_FRACTION = 0.1  # ... this fraction of train.steps,
AUTO_WARMUP_MAX = 100       # ... at most this many steps


def warmup_steps(train: Any) -> int:
    """train.warmup_steps, or with the default -1, min(100, 10% of train.steps): a shortened run
    (--config.train.steps=50) warms up for 5 steps instead of being refused. An explicit warm-up longer
    than the run stays an error (TrainSpec). `train`: a TrainSpec or the config's train block."""
    warmup = int(train.warmup_steps)
    if warmup == AUTO_WARMUP:
        return min(AUTO_WARMUP_MAX, int(AUTO_WARMUP_FRACTION * int(train.steps)))
    return warmup


def decay_start(train: Any) -> int | None:
    """The step where a warm-up–stable–decay ("wsd") schedule leaves its stable phase: train.steps −
    round(train.decay_fraction · train.steps); None for the other schedules. Up to this step a wsd run's
    learning rate does not depend on train.steps, so a run of S steps and one of S' > S steps are the same
    run until S's decay starts: the checkpoint there continues to S' (a longer run, or a sweep's branch)."""
    if train.schedule != "wsd":
        return None
    steps = int(train.steps)
    return steps - int(round(float(train.decay_fraction) * steps))


def lr_at(count: Any, *, peak: float, steps: int, warmup: int, schedule: str, final_lr_fraction: float,
          decay_from: int | None = None, xp: Any = np) -> Any:
    """The learning rate after `count` updates, i.e. of step s = count + 1 (scalar or array; traced under jit with
    xp=jax.numpy) as float32: peak·s/warmup up to the warm-up's end, then the decay, at final_lr_fraction·peak
    at s = steps. `decay_from`: wsd's decay start (decay_start()); ignored by the other schedules."""
    s = xp.asarray(count).astype(xp.float32) + 1.0  # the step this rate trains
    end = peak * float(final_lr_fraction)
    warm = peak * xp.minimum(s / max(warmup, 1), 1.0)
    if schedule == "wsd":
        cool = max(steps - int(decay_from), 1)
        after = end + (peak - end) * (1.0 - xp.sqrt(xp.clip((s - decay_from) / cool, 0.0, 1.0)))
    else:
        frac = xp.clip((s - warmup) / max(steps - warmup, 1), 0.0, 1.0)
        if schedule == "cosine":
            after = end + (peak - end) * 0.5 * (1.0 + xp.cos(math.pi * frac))
        elif schedule == "linear":
            after = peak + (end - peak) * frac
        else:
            after = peak + 0.0 * frac
    return xp.where(s <= warmup, warm, after).astype(xp.float32)


def _check_int(name: str, value: Any, what: str, low: int = 0) -> None:
    """ConfigError unless `value` is an int (not a bool) >= `low`; `what` says what is valid."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{name}={value!r} must be {what}")


def _check_real(name: str, value: Any, low: float, high: float, low_in: bool, high_in: bool, what: str) -> None:
    """ConfigError unless `value` is a finite real number (not a bool) in the range from `low` to `high`
    (each end included or not); `what` says what the setting is and what is valid."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
    if ok:
        v = float(value)
        ok = (v >= low if low_in else v > low) and (v <= high if high_in else v < high)
    if not ok:
        raise ConfigError(f"{name}={value!r} must be {what}")


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """The train.* settings (defaults: configs/common.py's), checked when built: each mistake is one
    ConfigError naming the setting and what would be valid."""

    steps: int = 1000
    batch_size: int = 16
    learning_rate: float = 1e-3
    warmup_steps: int = AUTO_WARMUP
    schedule: str = "cosine"
    final_lr_fraction: float = 0.1
    decay_fraction: float = 0.2
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    eval_every: int = 200
    eval_steps: int = 8
    checkpoint_every: int = 200
    keep_checkpoints: int = 3
    compute_dtype: str = "float32"
    loss_chunk_size: int = 0
    nonfinite: str = "stop"
    max_skipped_fraction: float = MAX_SKIPPED_FRACTION
    task: str = ""
    init_from: str = ""
    grad_accum_steps: int = 1
    eval_tasks: str = ""        # likelihood-scored tasks at every evaluation (data/choice_tasks.py)
    eval_tasks_limit: int = 0   # documents per task (0: all)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "log_every", "eval_every", "eval_steps", "checkpoint_every",
                     "keep_checkpoints"):
            check_positive_int(f"train.{name}", getattr(self, name))
        check_positive_int("train.grad_accum_steps", self.grad_accum_steps)
        if self.batch_size % self.grad_accum_steps:
            raise ConfigError(f"train.grad_accum_steps={self.grad_accum_steps} must divide train.batch_size="
                              f"{self.batch_size} (each update sums that many micro-batches of equal size); valid: "
                              f"{', '.join(str(k) for k in range(1, self.batch_size + 1) if self.batch_size % k == 0)}")
        check_choice("train.nonfinite", self.nonfinite, NONFINITE_POLICIES)
        check_choice("train.compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
        _check_int("train.seed", self.seed, "an integer >= 0")
        _check_int("train.loss_chunk_size", self.loss_chunk_size, "an integer >= 0 (0: off)")
        _check_int("train.warmup_steps", self.warmup_steps, f"an integer between 0 and train.steps, or "
                   f"{AUTO_WARMUP} (the default)", low=AUTO_WARMUP)
        _check_int("train.eval_tasks_limit", self.eval_tasks_limit, "an integer >= 0 (0: every document)")
        for name in ("task", "init_from", "eval_tasks"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"train.{name}={getattr(self, name)!r} must be a string")
        # (setting, lowest, highest, lowest included, highest included, what is valid)
        for name, low, high, low_in, high_in, what in (
                ("learning_rate", 0.0, math.inf, False, False, "positive and finite (the peak learning rate)"),
                ("b1", 0.0, 1.0, True, False, "in [0, 1) (Adam's first-moment decay)"),
                ("b2", 0.0, 1.0, True, False, "in [0, 1) (Adam's second-moment decay)"),
                ("eps", 0.0, math.inf, False, False, "positive and finite (Adam's epsilon)"),
                ("weight_decay", 0.0, math.inf, True, False, ">= 0 and finite (decoupled weight decay)"),
                ("grad_clip", 0.0, math.inf, True, False, ">= 0 and finite (the global-norm clip; 0 disables "
                                                         "clipping)"),
                ("final_lr_fraction", 0.0, 1.0, True, True, "in [0, 1] (the decay's end, a fraction of the peak)"),
                ("decay_fraction", 0.0, 1.0, False, True, "in (0, 1] (wsd: the last fraction of train.steps spent "
                                                         "decaying)"),
                ("max_skipped_fraction", 0.0, 1.0, True, True, "in [0, 1] (the share of train.steps a "
                                                              "train.nonfinite='skip' run may drop)")):
            _check_real(f"train.{name}", getattr(self, name), low, high, low_in, high_in, what)
        check_choice("train.schedule", self.schedule, SCHEDULES)
        warmup = self.warmup
        if not 0 <= warmup <= self.steps:
            raise ConfigError(f"train.warmup_steps={warmup} must be between 0 and train.steps={self.steps} (or -1, "
                              f"the default: min({AUTO_WARMUP_MAX}, {AUTO_WARMUP_FRACTION:.0%} of train.steps))")
        if self.schedule == "wsd":
            if self.decay_start < warmup:
                raise ConfigError(f"train.schedule='wsd': the warm-up ({warmup} steps) overlaps the decay, which "
                                  f"starts at step {self.decay_start} (train.decay_fraction={self.decay_fraction} "
                                  f"of {self.steps}); shorten the warm-up or the decay")

    @classmethod
    def from_config(cls, train: Any) -> "TrainSpec":
        """From `config.train` (a ConfigDict, a mapping or a TrainSpec); keys missing there take the
        defaults above, keys this spec does not hold are left to their own readers."""
        if isinstance(train, TrainSpec):
            return train
        d = train.to_dict() if hasattr(train, "to_dict") else dict(train)
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})

    @property
    def warmup(self) -> int:
        """Warm-up steps, the default -1 resolved (warmup_steps())."""
        return warmup_steps(self)

    @property
    def decay_start(self) -> int | None:
        """wsd's decay start (decay_start()); None for the other schedules."""
        return decay_start(self)

    def lr_at(self, count: Any, *, peak: float | None = None, xp: Any = np) -> Any:
        """The learning rate after `count` updates (lr_at()); `peak` defaults to train.learning_rate."""
        return lr_at(count, peak=float(self.learning_rate if peak is None else peak), steps=self.steps,
                     warmup=self.warmup, schedule=self.schedule, final_lr_fraction=self.final_lr_fraction,
                     decay_from=self.decay_start, xp=xp)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def train_spec(train: Mapping[str, Any] | Any) -> TrainSpec:
    """TrainSpec.from_config: the one way a train block becomes a checked spec."""
    return TrainSpec.from_config(train)
