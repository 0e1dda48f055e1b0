"""Autoregressive generation with the key/value cache, compiled once per shape.

Legend: B batch (prompts), P padded prompt length, N new tokens, V vocabulary, E stop tokens,
S source length (encoder–decoder), D model width.

Ragged prompts are LEFT-padded: every row's last prompt token sits in column P - 1, so one prefill
call ends every row at the same cache slot and each decode step writes one shared column. Padding
carries segment id 0 and real tokens segment id 1, so (through the cache's stored segment ids)
padding is never attended to by a real token; positions count from 0 at each row's first real
token, so a left-padded row sees exactly the positions it would see alone.

`generate` runs, under one `jax.jit`: an empty cache of length P + N (shapes from `jax.eval_shape`,
no parameter init), the prompt prefill in one call, then a `jax.lax.while_loop` of one token per
step that stops early when every row has emitted a stop token. Rows that have stopped emit
`pad_id`. Sampling settings are traced, so changing them does not recompile.

Encoder–decoder (`generate_seq2seq`): sources are RIGHT-padded (segment id 0 masks them out of
encoder self-attention and the decoder's cross-attention), encoded once; the decoder then runs the
same prefill + cached loop on its target prefixes (default: the decoder start token alone).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.inference.sampling import SamplingConfig, sample_tokens
from transformer.spec import ConfigError


@dataclasses.dataclass(frozen=True)
class Generation:
    """tokens_BN: new tokens (pad_id after a row's stop token); lengths_B: tokens up to and including
    the stop token (N when none came); logits_BNV: the logits each token was chosen from (float32),
    when asked for."""

    tokens_BN: np.ndarray
    lengths_B: np.ndarray
    logits_BNV: np.ndarray | None = None

    def sequences(self) -> list[list[int]]:
        """Each row's new tokens up to and including its stop token."""
        return [row[:n].tolist() for row, n in zip(self.tokens_BN, self.lengths_B)]


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ragged prompts -> (tokens_BP, segment_ids_BP, positions_BP), int32, padded on the left.

    Padding has segment id 0 and position 0; real tokens segment id 1 and positions 0, 1, ...
    """
    if not prompts:
        raise ConfigError("prompts is empty; give at least one prompt")
    lengths = [len(p) for p in prompts]
    if min(lengths) == 0:
        raise ConfigError(f"prompt {lengths.index(0)} is empty; every prompt needs at least one token "
                         "(e.g. the tokenizer's bos id)")
    P = max(lengths)
    tokens_BP = np.full((len(prompts), P), pad_id, np.int32)
    segment_ids_BP = np.zeros((len(prompts), P), np.int32)
    positions_BP = np.zeros((len(prompts), P), np.int32)
    for b, prompt in enumerate(prompts):
        n = len(prompt)
        tokens_BP[b, P - n:] = np.asarray(prompt, np.int32)
        segment_ids_BP[b, P - n:] = 1
        positions_BP[b, P - n:] = np.arange(n)
    return tokens_BP, segment_ids_BP, positions_BP


def right_pad(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ragged sequences -> (tokens_BS, segment_ids_BS), int32, padded on the right (padding: segment 0)."""
    if not sequences or min(len(s) for s in sequences) == 0:
        raise ConfigError("every source sequence needs at least one token")
    S = max(len(s) for s in sequences)
    tokens_BS = np.full((len(sequences), S), pad_id, np.int32)
    segment_ids_BS = np.zeros((len(sequences), S), np.int32)
    for b, seq in enumerate(sequences):
        tokens_BS[b, :len(seq)] = np.asarray(seq, np.int32)
        segment_ids_BS[b, :len(seq)] = 1
    return tokens_BS, segment_ids_BS


def _check_length(cfg: Any, longest_prompt: int, max_new_tokens: int) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
    if cfg.positional == "learned" and longest_prompt + max_new_tokens > cfg.max_len:
        raise ConfigError(f"the longest prompt ({longest_prompt} tokens) + max_new_tokens={max_new_tokens} exceeds "
                         f"model.max_len={cfg.max_len} (the learned position table); shorten one of them")


def empty_cache(model: nn.Module, init_args: tuple, **init_kwargs: Any) -> Any:
    """A zero "cache" collection for `model.init(rng, *init_args, decode=True)`, without running init.

    Self-attention caches only: a cross-attention cache holds the projected context, which zeros are not
    (`_generate_seq2seq` makes its cache with a real call instead)."""
    shapes = jax.eval_shape(functools.partial(model.init, decode=True, **init_kwargs), jax.random.PRNGKey(0),
                            *init_args)["cache"]
    if any("cached_cross_key" in jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(shapes)):
        raise ValueError("empty_cache cannot make a cross-attention cache (it must hold the projected context): "
                         "create it with model.apply(..., decode=True, mutable=['cache']) on the real context")
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def decode_loop(step_fn: Any, cache: Any, logits_BV: jax.Array, positions_B: jax.Array, rng: jax.Array,
                sampling: tuple[jax.Array, jax.Array, jax.Array], stop_tokens_E: jax.Array, pad_id: jax.Array,
                max_new_tokens: int, return_logits: bool) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """The shared token loop after the prefill (traced inside a jit).

    step_fn(cache, tokens_B1, positions_B1) -> (logits_B1V, cache) feeds one token per row.
    Returns (tokens_BN, lengths_B, logits_BNV or None).
    """
    B, V = logits_BV.shape
    N = max_new_tokens
    temperature, top_k, top_p = sampling

    def cond(carry):
        i, finished_B = carry[0], carry[4]
        return (i < N) & ~jnp.all(finished_B)

    def body(carry):
        i, cache, logits_BV, positions_B, finished_B, lengths_B, tokens_BN, logits_BNV = carry
        token_B = sample_tokens(jax.random.fold_in(rng, i), logits_BV, temperature, top_k, top_p)
        token_B = jnp.where(finished_B, pad_id, token_B)
        tokens_BN = tokens_BN.at[:, i].set(token_B)
        if return_logits:
            logits_BNV = logits_BNV.at[:, i].set(logits_BV)
        lengths_B = lengths_B + (~finished_B).astype(jnp.int32)
        finished_B = finished_B | jnp.isin(token_B, stop_tokens_E)
        next_logits_B1V, cache = step_fn(cache, token_B[:, None], positions_B[:, None])
        return (i + 1, cache, next_logits_B1V[:, 0], positions_B + 1, finished_B, lengths_B, tokens_BN,
                logits_BNV)

    init = (jnp.zeros((), jnp.int32), cache, logits_BV.astype(jnp.float32), positions_B,
            jnp.zeros((B,), bool), jnp.zeros((B,), jnp.int32), jnp.full((B, N), pad_id, jnp.int32),
            jnp.zeros((B, N, V), jnp.float32) if return_logits else jnp.zeros((), jnp.float32))
    out = jax.lax.while_loop(cond, body, init)
    return out[6], out[5], (out[7] if return_logits else None)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "return_logits"))
def _generate_decoder(model: nn.Module, params: Any, tokens_BP: jax.Array, segment_ids_BP: jax.Array,
                      positions_BP: jax.Array, rng: jax.Array, sampling: tuple, stop_tokens_E: jax.Array,
                      pad_id: jax.Array, *, max_new_tokens: int, return_logits: bool):
    B, P = tokens_BP.shape
    cache = empty_cache(model, (jnp.zeros((B, P + max_new_tokens), jnp.int32),))
    logits_BPV, mutated = model.apply({"params": params, "cache": cache}, tokens_BP, positions_BP, segment_ids_BP,
                                      decode=True, mutable=["cache"])

    def step_fn(cache, tokens_B1, positions_B1):
        logits_B1V, mutated = model.apply({"params": params, "cache": cache}, tokens_B1, positions_B1,
                                          jnp.ones_like(tokens_B1), decode=True, mutable=["cache"])
        return logits_B1V, mutated["cache"]

    return decode_loop(step_fn, mutated["cache"], logits_BPV[:, -1], positions_BP[:, -1] + 1, rng, sampling,
                       stop_tokens_E, pad_id, max_new_tokens, return_logits)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "return_logits"))
def _generate_seq2seq(model: nn.Module, params: Any, src_tokens_BS: jax.Array, src_segment_ids_BS: jax.Array,
                      tokens_BP: jax.Array, segment_ids_BP: jax.Array, positions_BP: jax.Array, rng: jax.Array,
                      sampling: tuple, stop_tokens_E: jax.Array, pad_id: jax.Array, *, max_new_tokens: int,
                      return_logits: bool):
    B, P = tokens_BP.shape
    variables = {"params": params}
    encoded_BSD = model.apply(variables, src_tokens_BS, src_segment_ids_BS, method="encode")
    # Made by a real call (not empty_cache's zeros): cross-attention caches its projection of encoded_BSD.
    _, made = model.apply(variables, jnp.zeros((B, P + max_new_tokens), jnp.int32), encoded_BSD, src_segment_ids_BS,
                          decode=True, method="decode", mutable=["cache"])
    cache = made["cache"]

    def step_fn(cache, tokens_BT, positions_BT, segment_ids_BT=None):
        segment_ids_BT = jnp.ones_like(tokens_BT) if segment_ids_BT is None else segment_ids_BT
        logits_BTV, mutated = model.apply({"params": params, "cache": cache}, tokens_BT, encoded_BSD,
                                          src_segment_ids_BS, positions_BT, segment_ids_BT, decode=True,
                                          method="decode", mutable=["cache"])
        return logits_BTV, mutated["cache"]

    logits_BPV, cache = step_fn(cache, tokens_BP, positions_BP, segment_ids_BP)
    return decode_loop(step_fn, cache, logits_BPV[:, -1], positions_BP[:, -1] + 1, rng, sampling, stop_tokens_E,
                       pad_id, max_new_tokens, return_logits)


def _sampling_args(sampling: SamplingConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
    return (jnp.float32(sampling.temperature), jnp.int32(sampling.top_k), jnp.float32(sampling.top_p))


def generate(model: nn.Module, params: Any, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
             rng: jax.Array | None = None, sampling: SamplingConfig = SamplingConfig(),
             stop_tokens: Sequence[int] = (), pad_id: int = 0, return_logits: bool = False) -> Generation:
    """Continue each prompt (token ids; lengths may differ) of a decoder-only `model` (DecoderLM).

    rng: needed unless sampling.temperature == 0 (greedy). Rows that emit one of `stop_tokens` stop
    and emit `pad_id` afterwards; the loop ends once every row has stopped.
    """
    if sampling.temperature > 0 and rng is None:
        raise ValueError("sampling with temperature > 0 needs rng (a jax.random key); temperature=0 is greedy")
    tokens_BP, segment_ids_BP, positions_BP = left_pad(prompts, pad_id)
    _check_length(model.cfg, tokens_BP.shape[1], max_new_tokens)
    tokens_BN, lengths_B, logits_BNV = _generate_decoder(
        model, params, tokens_BP, segment_ids_BP, positions_BP,
        jax.random.PRNGKey(0) if rng is None else rng, _sampling_args(sampling),
        jnp.asarray(list(stop_tokens), jnp.int32), jnp.int32(pad_id), max_new_tokens=max_new_tokens,
        return_logits=return_logits)
    return Generation(np.asarray(tokens_BN), np.asarray(lengths_B),
                      None if logits_BNV is None else np.asarray(logits_BNV))


def generate_seq2seq(model: nn.Module, params: Any, sources: Sequence[Sequence[int]], *, max_new_tokens: int,
                     targets: Sequence[Sequence[int]] | None = None, decoder_start_id: int = 1,
                     rng: jax.Array | None = None, sampling: SamplingConfig = SamplingConfig(),
                     stop_tokens: Sequence[int] = (), pad_id: int = 0, return_logits: bool = False) -> Generation:
    """Continue each target prefix (default [decoder_start_id]) given its source, with an encoder–decoder
    `model` (EncoderDecoderModel): the sources are encoded once, then the decoder decodes with its cache."""
    if sampling.temperature > 0 and rng is None:
        raise ValueError("sampling with temperature > 0 needs rng (a jax.random key); temperature=0 is greedy")
    targets = [[decoder_start_id]] * len(sources) if targets is None else targets
    if len(targets) != len(sources):
        raise ValueError(f"{len(sources)} sources but {len(targets)} target prefixes; give one prefix per source")
    src_BS, src_segment_ids_BS = right_pad(sources, pad_id)
    tokens_BP, segment_ids_BP, positions_BP = left_pad(targets, pad_id)
    cfg = model.cfg
    _check_length(cfg, tokens_BP.shape[1], max_new_tokens)
    if cfg.positional == "learned" and src_BS.shape[1] > cfg.max_len:
        raise ConfigError(f"the longest source ({src_BS.shape[1]} tokens) exceeds model.max_len={cfg.max_len}")
    tokens_BN, lengths_B, logits_BNV = _generate_seq2seq(
        model, params, src_BS, src_segment_ids_BS, tokens_BP, segment_ids_BP, positions_BP,
        jax.random.PRNGKey(0) if rng is None else rng, _sampling_args(sampling),
        jnp.asarray(list(stop_tokens), jnp.int32), jnp.int32(pad_id), max_new_tokens=max_new_tokens,
        return_logits=return_logits)
    return Generation(np.asarray(tokens_BN), np.asarray(lengths_B),
                      None if logits_BNV is None else np.asarray(logits_BNV))
