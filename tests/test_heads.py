"""Attention heads: importance (Michel et al. 2019: the gradient of the loss with respect to a head mask) and real
pruning (model.pruned_heads: smaller kernels) for every family, self- and cross-attention, grouped-query heads
included."""
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.layers import head_pruning
from transformer.models import build_model
from transformer.spec import ConfigError, ModelConfig, flops_per_token, param_counts, pruning
from transformer.tasks import get_task
from transformer.training import heads

CASES = {
    "decoder": (dict(family="decoder"), {"blocks/layers_0/attention": [1, 2], "blocks/layers_1/attention": [0]}),
    "decoder-gqa": (dict(family="decoder", num_kv_heads=2, positional="rope", activation="swiglu", norm="rmsnorm"),
                    {"blocks/layers_0/attention": [2, 3], "blocks/layers_1/attention": [0, 3]}),
    "decoder-mqa-alibi": (dict(family="decoder", num_kv_heads=1, positional="alibi"),
                          {"blocks/layers_1/attention": [0, 1, 3]}),
    "encoder": (dict(family="encoder", norm_position="post", embedding_norm=True),
                {"encoder/blocks/layers_1/attention": [3]}),
    "encoder_decoder": (dict(family="encoder_decoder", positional="t5_relative", use_bias=False, norm="rmsnorm"),
                        {"encoder/blocks/layers_0/attention": [0], "decoder/blocks/layers_0/attention": [1, 2],
                         "decoder/blocks/layers_1/cross_attention": [3]}),
}


def _cfg(settings: dict, **kw) -> ModelConfig:
    return ModelConfig(**{**dict(d_model=32, num_heads=4, d_ff=48, num_layers=2, vocab_size=64,
                                 attention_impl="einsum", relative_num_buckets=8, relative_max_distance=16),
                          **settings, **kw})


def _task(cfg: ModelConfig):
    name = {"decoder": "lm", "encoder": "mlm", "encoder_decoder": "span_corruption"}[cfg.family]
    return get_task(types.SimpleNamespace(train=types.SimpleNamespace(task=name),
                                          model=types.SimpleNamespace(family=cfg.family)))


def _batch(cfg: ModelConfig, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    B, T = 3, 8
    tokens = rng.integers(3, cfg.vocab_size, (B, T + 1)).astype(np.int32)
    pos = np.tile(np.arange(T, dtype=np.int32), (B, 1))
    seg, w = np.ones((B, T), np.int32), np.ones((B, T), np.float32)
    if cfg.family == "decoder":
        return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "positions": pos, "segment_ids": seg, "weights": w}
    if cfg.family == "encoder":
        return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "positions": pos, "segment_ids": seg, "weights": w}
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "decoder_inputs": tokens[:, :-1],
            "input_segment_ids": seg, "target_segment_ids": seg, "input_positions": pos, "target_positions": pos,
            "weights": w}


def _init(cfg: ModelConfig):
    model = build_model(cfg)
    args = (jnp.zeros((1, 8), jnp.int32),) * (2 if cfg.family == "encoder_decoder" else 1)
    params = nn.unbox(model.init(jax.random.PRNGKey(1), *args)["params"])
    rng = np.random.default_rng(2)  # biases and norms off their init, so every head matters
    return model, jax.tree.map(lambda x: x + jnp.asarray(rng.normal(0, 0.05, x.shape), x.dtype), params)


@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.slow] if c in ("decoder", "decoder-gqa") else []) for c in CASES])  # CI's 15 minutes (2026-11-27): gqa 19 s
def test_pruned_model_computes_the_masked_model(case):
    settings, removed = CASES[case]
    cfg = _cfg(settings)
    model, params = _init(cfg)
    task, batch = _task(cfg), _batch(cfg)
    ones = heads.mask_ones(model, task, params, batch)
    values = heads.flat(ones)
    assert sorted(values) == sorted(pruning.attention_paths(cfg))  # every attention layer, cross-attention too
    for path, h in removed.items():
        values[path][h] = 0.0
    masked = task.forward(heads.MaskedModel(model, heads.unflat(ones, values)), params, batch, deterministic=True,
                          rngs=None)[0]

    pruned_cfg = cfg.replace(pruned_heads=removed)
    pruned_params = head_pruning.prune_params(cfg, params, pruned_cfg.pruned_heads)
    pruned_model = build_model(pruned_cfg)
    got = task.forward(pruned_model, pruned_params, batch, deterministic=True, rngs=None)[0]
    np.testing.assert_allclose(np.asarray(got), np.asarray(masked), atol=2e-5, rtol=0)
    # the kernels are smaller, and the accounting says so
    shapes = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(pruned_params)}
    assert param_counts(pruned_cfg)["total"] == sum(int(np.prod(s)) for s in shapes.values())
    assert param_counts(pruned_cfg)["total"] < param_counts(cfg)["total"]
    assert flops_per_token(pruned_cfg, 8)["with_attention"] < flops_per_token(cfg, 8)["with_attention"]
    built = jax.eval_shape(lambda r: pruned_model.init(r, *(jnp.zeros((1, 8), jnp.int32),) * (
        2 if cfg.family == "encoder_decoder" else 1)), jax.random.PRNGKey(0))["params"]
    assert {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(nn.unbox(built))} == shapes
    # exported to a one-head-count layout: zero rows give the pruned model's function back at the full shape
    full_cfg, padded = head_pruning.zero_padded(pruned_cfg, pruned_params)
    again = task.forward(build_model(full_cfg), padded, batch, deterministic=True, rngs=None)[0]
    np.testing.assert_allclose(np.asarray(again), np.asarray(got), atol=2e-5, rtol=0)


@pytest.mark.parametrize("case", ["decoder-gqa", "encoder_decoder"])
def test_importance_is_the_gradient_of_the_loss_by_the_head_mask(case):
    cfg = _cfg(CASES[case][0])
    model, params = _init(cfg)
    task, batches = _task(cfg), [_batch(cfg, 0), _batch(cfg, 1)]
    scores = heads.importance(model, task, params, batches)
    assert set(scores) == set(pruning.attention_paths(cfg)) and all(v.shape == (4,) for v in scores.values())
    ones = heads.mask_ones(model, task, params, batches[0])
    eps = 1e-2
    for path in (pruning.attention_paths(cfg)[0], pruning.attention_paths(cfg)[-1]):
        for n in range(4):
            diffs = []
            for b in batches:  # |dL/dξ_n| per batch by central differences, then the mean
                up, down = heads.flat(ones), heads.flat(ones)
                up[path][n], down[path][n] = 1 + eps, 1 - eps
                loss = lambda v: float(heads._loss(model, task, params, heads.unflat(ones, v), b))
                diffs.append(abs(loss(up) - loss(down)) / (2 * eps))
            np.testing.assert_allclose(scores[path][n], np.mean(diffs), rtol=2e-2, atol=1e-4)
    norm = heads.normalized(scores)
    assert all(abs(np.linalg.norm(v) - 1) < 1e-6 for v in norm.values())


@pytest.mark.slow  # CI's 15 minutes: 22 s of the default run on 2 loaded cores (2026-11-27)
def test_scanned_layers_have_one_score_row_per_layer():
    cfg = _cfg(CASES["decoder"][0], scan_layers=True)
    model, params = _init(cfg)
    task, batch = _task(cfg), _batch(cfg)
    unscanned, unscanned_params = build_model(cfg.replace(scan_layers=False)), {
        **params, "blocks": {f"layers_{i}": jax.tree.map(lambda x: x[i], params["blocks"]["layers"])
                             for i in range(2)}}
    a = heads.importance(model, task, params, [batch])
    b = heads.importance(unscanned, task, unscanned_params, [batch])
    assert sorted(a) == sorted(b) == sorted(pruning.attention_paths(cfg))
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-7)


@pytest.mark.slow  # CI's time (the default run is at its 15 minutes); -m slow runs it
def test_pruning_curve_removes_units_by_importance_or_at_random():
    cfg = _cfg(CASES["decoder-gqa"][0], num_heads=8, num_kv_heads=4)  # groups of 2: units are whole groups
    model, params = _init(cfg)
    task, batches = _task(cfg), [_batch(cfg, 0)]
    base = heads.evaluate(model, task, params, batches, heads.mask_ones(model, task, params, batches[0]))
    rows = heads.pruning_curve(model, task, params, batches, [0.0, 0.25, 0.5, 0.75], order="importance")
    assert [r["removed"] for r in rows] == [0, 2, 4, 6] and rows[0]["loss"] == pytest.approx(base["loss"])
    last = rows[-1]["pruned"]
    assert all(len(h) % 2 == 0 and all(h[i] // 2 == h[i + 1] // 2 for i in range(0, len(h), 2))
               for h in last.values())  # whole groups
    assert all(len(h) <= 6 for h in last.values())  # a group stays in every layer
    _ = build_model(cfg.replace(pruned_heads=last))  # what the curve removed is a valid model.pruned_heads
    rand = heads.pruning_curve(model, task, params, batches, [0.5], order="random", seed=3)
    assert rand[0]["removed"] == 4
    with pytest.raises(ValueError, match="at most 6"):
        heads.pruning_curve(model, task, params, batches, [0.9])


@pytest.mark.parametrize("value,match", [
    ('{"blocks/layers_9/attention": [0]}', "not an attention layer of this model"),
    ('{"blocks/layers_0/attention": [4]}', r"numbered 0\.\.3"),
    ('{"blocks/layers_0/attention": [0, 1, 2, 3]}', "keep at least one"),
    ("[1, 2]", "must map attention layers"),
    ("{not json", "is not JSON"),
])
def test_bad_pruned_heads_are_named(value, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(CASES["decoder"][0], pruned_heads=value)


def test_grouped_heads_prune_in_equal_groups_and_not_scanned():
    with pytest.raises(ConfigError, match="every kept group must keep as many"):
        _cfg(CASES["decoder-gqa"][0], pruned_heads={"blocks/layers_0/attention": [0]})
    with pytest.raises(ConfigError, match="scan_layers=False"):
        _cfg(CASES["decoder"][0], pruned_heads={"blocks/layers_0/attention": [0]}, scan_layers=True)
    cfg = _cfg(CASES["decoder-gqa"][0], pruned_heads={"blocks/layers_0/attention": [0, 1]})
    assert pruning.layer_heads(cfg, "blocks/layers_0/attention") == (2, 1)


def test_a_pruned_model_only_loses_more_heads():
    cfg = _cfg(CASES["decoder"][0], pruned_heads={"blocks/layers_0/attention": [1]})
    with pytest.raises(ConfigError, match="only lose more heads"):
        head_pruning.select(cfg, cfg.pruned_heads, pruning.canonical({"blocks/layers_0/attention": [2]}))
    rows = head_pruning.select(cfg, cfg.pruned_heads, pruning.canonical({"blocks/layers_0/attention": [1, 3]}))
    assert rows == {"blocks/layers_0/attention": ([0, 1], [0, 1])}  # heads 0 and 2: rows 0 and 1 of [0, 2, 3]
