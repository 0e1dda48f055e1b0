"""Encoder–decoder models and T5 span corruption: padding masks, cached decoding, counts, the data."""
from __future__ import annotations

import copy

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import seq2seq
from transformer.data import get_tokenizer, make_lm_iterator
from transformer.data.span_corruption import (DECODER_START_ID, corrupt, make_span_corruption_iterator,
                                              random_spans_noise_mask, span_corruption_lengths, span_lengths,
                                              uncorrupt)
from transformer.spec import ModelConfig
from transformer.inference.generate import empty_cache
from transformer.models.encoder_decoder import EncoderDecoderModel
from transformer.spec import param_counts

PRESETS = ["vaswani_tiny", "t5_tiny"]


def _cfg(preset: str, **overrides) -> ModelConfig:
    return ModelConfig(**(dict(seq2seq.PRESETS[preset], family="encoder_decoder", vocab_size=97) | overrides))


def _small(preset: str) -> ModelConfig:
    return _cfg(preset, d_model=32, num_heads=4, d_ff=48, num_layers=2, num_encoder_layers=3, max_len=64)


@pytest.mark.parametrize("preset", PRESETS + ["vaswani_base", "t5_small"])
@pytest.mark.parametrize("positional", ["preset", "learned"])
def test_param_counts_equal_real_model(preset, positional):
    cfg = _cfg(preset) if positional == "preset" else _cfg(preset, positional="learned", embedding_norm=True)
    shapes = jax.eval_shape(EncoderDecoderModel(cfg).init, jax.random.PRNGKey(0), jnp.ones((1, 6), jnp.int32),
                            jnp.ones((1, 4), jnp.int32))
    params = nn.unbox(shapes["params"])
    assert param_counts(cfg)["total"] == int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


@pytest.mark.parametrize("preset", PRESETS)
def test_padded_source_positions_are_ignored(preset):
    model = EncoderDecoderModel(_small(preset))
    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(3, 97, (2, 10)), jnp.int32)
    tgt = jnp.asarray(rng.integers(3, 97, (2, 7)), jnp.int32)
    src_seg = jnp.asarray([[1] * 10, [1] * 6 + [0] * 4])
    variables = model.init(jax.random.PRNGKey(0), src, tgt, src_seg)
    base = model.apply(variables, src, tgt, src_seg)
    changed_src = src.at[1, 6:].set(jnp.asarray(rng.integers(3, 97, 4), jnp.int32))
    np.testing.assert_array_equal(model.apply(variables, changed_src, tgt, src_seg), base)
    # ...while a real source token does reach every target position (cross-attention works).
    moved = model.apply(variables, src.at[1, 2].set(src[1, 2] % 90 + 4), tgt, src_seg)
    assert np.min(np.max(np.abs(moved[1] - base[1]), axis=-1)) > 1e-6


@pytest.mark.parametrize("preset", [pytest.param("vaswani_tiny", marks=pytest.mark.slow), "t5_tiny"])  # CI's 15 minutes (2026-11-27): 16-17 s
def test_decoder_is_causal(preset):
    model = EncoderDecoderModel(_small(preset))
    rng = np.random.default_rng(1)
    src = jnp.asarray(rng.integers(3, 97, (1, 8)), jnp.int32)
    tgt = jnp.asarray(rng.integers(3, 97, (1, 6)), jnp.int32)
    variables = model.init(jax.random.PRNGKey(0), src, tgt)
    base = model.apply(variables, src, tgt)
    changed = model.apply(variables, src, tgt.at[0, 4].set(tgt[0, 4] % 90 + 4))
    np.testing.assert_array_equal(changed[0, :4], base[0, :4])
    assert np.max(np.abs(changed[0, 4:] - base[0, 4:])) > 1e-6


@pytest.mark.parametrize("preset", [pytest.param("vaswani_tiny", marks=pytest.mark.slow), "t5_tiny"])  # CI's 15 minutes (2026-11-27): 16-17 s
def test_cached_decoding_equals_full_forward(preset):
    model = EncoderDecoderModel(_small(preset))
    rng = np.random.default_rng(2)
    src = jnp.asarray(rng.integers(3, 97, (2, 9)), jnp.int32)
    src_seg = jnp.asarray([[1] * 9, [1] * 5 + [0] * 4])
    tgt = jnp.asarray(rng.integers(3, 97, (2, 8)), jnp.int32)
    variables = model.init(jax.random.PRNGKey(0), src, tgt, src_seg)
    full = model.apply(variables, src, tgt, src_seg)
    encoded = model.apply(variables, src, src_seg, method="encode")
    _, cache = model.apply(variables, jnp.zeros_like(tgt), encoded, src_seg, decode=True, method="decode",
                           mutable=["cache"])
    assert set(cache["cache"]["decoder"]["blocks"]["layers_0"]["cross_attention"]) == {
        "cached_cross_key", "cached_cross_value"}
    with pytest.raises(ValueError, match="cross-attention cache"):  # zeros would stand in for the context
        empty_cache(model, (jnp.zeros_like(tgt), encoded, src_seg), method="decode")
    # The steps get a zero context: equal logits show that cross-attention uses its cached projection.
    step = jax.jit(lambda c, tok: model.apply(variables | c, tok, jnp.zeros_like(encoded), src_seg, decode=True,
                                              method="decode", mutable=["cache"]))
    for t in range(tgt.shape[1]):
        logits, cache = step(cache, tgt[:, t:t + 1])
        np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5, rtol=1e-5)


def test_span_corruption_round_trip_and_statistics():
    rng = np.random.default_rng(0)
    noise, spans = 0, 0
    for n in [2, 3, 7, 50, 141, 568]:
        for _ in range(20):
            row = rng.integers(3, 259, n)
            mask = random_spans_noise_mask(n, 0.15, 3.0, rng)
            inputs, targets = corrupt(row, mask, 259, 2)
            np.testing.assert_array_equal(uncorrupt(inputs, targets, 259, 2), row)
            if n == 568:
                noise, spans = noise + mask.sum(), spans + np.sum(mask[1:] & ~mask[:-1])
                assert not mask[0]  # rows start with a kept span
    assert noise / (20 * 568) == pytest.approx(0.15, abs=0.002)
    assert noise / spans == pytest.approx(3.0, abs=0.1)
    assert span_lengths(512, 0.15, 3.0) == (568, 114, 28)  # T5's figures for 512-token inputs


def test_span_corruption_pipeline_reassembles_the_text(corpus_dir):
    c = seq2seq.get_config()
    c.data.data_dir, c.data.seq_len = corpus_dir, 64
    raw_len, tgt_len, num_sentinels = span_corruption_lengths(c.data)
    kwargs = dict(split="validation", global_batch_size=4, seed=5)
    batch = next(make_span_corruption_iterator(c.data, **kwargs))
    raw_cfg = copy.deepcopy(c.data)
    raw_cfg.seq_len = raw_len
    rows = next(make_lm_iterator(raw_cfg, **kwargs))["inputs"]  # the same rows, uncorrupted
    tok = get_tokenizer(c.data)
    assert batch["inputs"].shape == (4, 64) and batch["targets"].shape == (4, tgt_len)
    for b in range(4):
        src = batch["inputs"][b][batch["input_segment_ids"][b] == 1]
        tgt = batch["targets"][b][batch["target_segment_ids"][b] == 1]
        assert src[-1] == tgt[-1] == tok.eos_id
        assert set(tgt[tgt >= tok.vocab_size]) <= set(range(tok.vocab_size, tok.vocab_size + num_sentinels))
        restored = uncorrupt(src, tgt, tok.vocab_size, tok.eos_id)
        np.testing.assert_array_equal(restored, rows[b])
        assert tok.decode(restored) == tok.decode(rows[b])
    np.testing.assert_array_equal(batch["decoder_inputs"][:, 0], DECODER_START_ID)
    np.testing.assert_array_equal(batch["decoder_inputs"][:, 1:], batch["targets"][:, :-1] * batch["target_segment_ids"][:, 1:])
    np.testing.assert_array_equal(batch["weights"], batch["target_segment_ids"])
