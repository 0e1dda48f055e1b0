"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus) sampling.

Legend: B batch, V vocabulary.

Every function is pure and jittable, and the settings may be traced scalars, so one compiled decode
loop serves every temperature / top-k / top-p (no recompilation when they change):
  temperature  0 → greedy (argmax); t > 0 → sample from softmax(logits / t)
  top_k        0 → off; k > 0 → keep the k most likely tokens (ties with the k-th are kept)
  top_p        1 → off; p in (0, 1) → keep the smallest set of most likely tokens whose probability
               reaches p (Holtzman et al. 2019); the most likely token is always kept.
Filters apply after the temperature, top-k before top-p (as in Hugging Face's samplers).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from transformer.spec import ConfigError


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to pick tokens; validated on construction (a ConfigError names the setting)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ConfigError(f"temperature={self.temperature!r} must be >= 0 (0 is greedy)")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ConfigError(f"top_k={self.top_k!r} must be a non-negative integer (0 turns it off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p={self.top_p!r} must be in (0, 1] (1 turns it off)")


def top_k_filter(logits_BV: jax.Array, k: jax.Array | int) -> jax.Array:
    """Logits outside each row's k largest set to -inf; k <= 0 leaves them unchanged."""
    V = logits_BV.shape[-1]
    k = jnp.asarray(k, jnp.int32)
    sorted_BV = jnp.sort(logits_BV, axis=-1)[:, ::-1]
    kth_B1 = jnp.take(sorted_BV, jnp.clip(k - 1, 0, V - 1), axis=-1)[:, None]
    return jnp.where((k > 0) & (logits_BV < kth_B1), -jnp.inf, logits_BV)


def top_p_filter(logits_BV: jax.Array, p: jax.Array | float) -> jax.Array:
    """Logits outside each row's nucleus of probability p set to -inf; p >= 1 leaves them unchanged.

    A token is kept when the probability of the tokens more likely than it is below p.
    """
    p = jnp.asarray(p, jnp.float32)
    sorted_BV = jnp.sort(logits_BV, axis=-1)[:, ::-1]
    probs_BV = jax.nn.softmax(sorted_BV.astype(jnp.float32), axis=-1)
    mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
    kept_B = jnp.maximum(jnp.sum(mass_before_BV < p, axis=-1), 1)
    threshold_B1 = jnp.take_along_axis(sorted_BV, (kept_B - 1)[:, None], axis=-1)
    return jnp.where((p < 1.0) & (logits_BV < threshold_B1), -jnp.inf, logits_BV)


def sample_tokens(rng: jax.Array, logits_BV: jax.Array, temperature: jax.Array | float = 1.0,
                  top_k: jax.Array | int = 0, top_p: jax.Array | float = 1.0) -> jax.Array:
    """One token per row, int32 tokens_B: argmax when temperature == 0, else a filtered sample."""
    logits_BV = logits_BV.astype(jnp.float32)
    temperature = jnp.asarray(temperature, jnp.float32)
    greedy_B = jnp.argmax(logits_BV, axis=-1)
    scaled_BV = logits_BV / jnp.where(temperature > 0, temperature, 1.0)
    filtered_BV = top_p_filter(top_k_filter(scaled_BV, top_k), top_p)
    sampled_B = jax.random.categorical(rng, filtered_BV, axis=-1)
    return jnp.where(temperature > 0, sampled_B, greedy_B).astype(jnp.int32)
