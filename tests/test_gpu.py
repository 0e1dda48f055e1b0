"""What only a GPU can check: cuDNN's fused attention (model.attention_impl="cudnn", what "auto" picks on a
GPU with bfloat16 compute) against the float32 truth, in training and in cached decoding, and the memory
estimator against the allocator's peak.

Skipped unless JAX's default backend is a GPU. The test session defaults to CPU (conftest.py); run them with
  JAX_PLATFORMS=cuda,cpu XLA_PYTHON_CLIENT_PREALLOCATE=false python -m pytest -q tests/test_gpu.py
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.layers.attention import MultiHeadAttention
from transformer.layers.sdpa import resolve_attention_impl
from transformer.spec import ModelConfig

from attention_checks import decode_in_steps, max_err, qkv, value_and_grads

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (JAX_PLATFORMS=cuda,cpu)")

N, H = 8, 64


def _qkv(T, K, seed=0, B=2):
    return qkv(T, K, jnp.bfloat16, N=N, H=H, seed=seed, B=B)


@pytest.mark.parametrize("K,segments,window", [(8, False, 0), (2, False, 0), (2, True, 0), (2, True, 48),
                                               (8, False, 48)])
def test_cudnn_forward_and_gradients_are_as_close_to_float32_as_the_bf16_reference(K, segments, window):
    """Causal attention with grouped KV heads, packed documents and a sliding window: cuDNN's output and
    gradients are as close to the float32 truth (autodiff of the einsum reference on the same bf16 values)
    as the einsum reference computed in bf16 is. A wrong mask or window moves whole rows: errors of O(1)."""
    T = 256
    q, k, v = _qkv(T, K, seed=1)
    rng = np.random.default_rng(2)
    seg = jnp.asarray(np.sort(rng.integers(1, 4, size=(2, T)), axis=1)) if segments else None
    kw = dict(causal=True, q_segment_ids_BT=seg, kv_segment_ids_BS=seg, sliding_window=window)
    truth = value_and_grads("einsum", *(x.astype(jnp.float32) for x in (q, k, v)), **kw)
    ref_bf16 = value_and_grads("einsum", q, k, v, **kw)
    cudnn = value_and_grads("cudnn", q, k, v, **kw)
    scale = max(float(jnp.max(jnp.abs(g))) for g in truth[1])
    for name, r, c, t in zip(("dq", "dk", "dv"), ref_bf16[1], cudnn[1], truth[1]):
        ref_err, cudnn_err = max_err(r, t), max_err(c, t)
        assert cudnn_err <= 2.0 * ref_err + 1e-3 * scale, (name, cudnn_err, ref_err, scale)
    assert abs(float(cudnn[0]) - float(truth[0])) < 0.02 * abs(float(truth[0])) + 0.5


def test_auto_picks_cudnn_here_for_bf16():
    cfg = ModelConfig(d_model=512, num_heads=8, dtype="bfloat16")
    assert resolve_attention_impl(cfg) == "cudnn"


def test_cudnn_decoding_agrees_with_the_full_forward_pass():
    """The cache path (queries at a cache offset, a mask array) and the prompt path (kernel flags)."""
    cfg = ModelConfig(d_model=N * H, num_heads=N, num_kv_heads=2, positional="rope", use_bias=False,
                      attention_impl="cudnn", dtype="bfloat16")
    T = 24
    x = jax.random.normal(jax.random.PRNGKey(0), (2, T, N * H))
    pos = jnp.broadcast_to(jnp.arange(T), (2, T))
    mha = MultiHeadAttention(cfg, causal=True)
    params = mha.init(jax.random.PRNGKey(1), x, pos)
    full = mha.apply(params, x, pos)
    reference = MultiHeadAttention(cfg.replace(attention_impl="einsum", dtype="float32"), causal=True)
    truth = reference.apply(params, x, pos)
    cache = mha.init(jax.random.PRNGKey(1), x, pos, decode=True)["cache"]
    decoded = decode_in_steps(mha, params, cache, x, pos, prefill=8).astype(jnp.float32)
    tol = 4 * float(jnp.max(jnp.abs(full.astype(jnp.float32) - truth))) + 1e-2
    assert float(jnp.max(jnp.abs(decoded - truth))) <= tol


def test_a_bf16_training_run_with_cudnn_follows_the_chunked_run(tmp_path, corpus_dir):
    """Eight steps of a small GPT-2 in bf16 through the training loop: cuDNN attention and the chunked
    attention give the same losses to bf16 accuracy, and the loss falls."""
    from configs.lm import get_config
    from transformer.training.loop import train

    losses = {}
    for impl in ("cudnn", "chunked"):
        config = get_config("default")
        config.data.data_dir = corpus_dir
        config.data.seq_len = 128
        config.model.num_heads = 4  # head dim 64
        config.model.attention_impl = impl
        config.train.update(compute_dtype="bfloat16", steps=8, warmup_steps=2, batch_size=8, eval_every=8,
                            eval_steps=1, checkpoint_every=8, log_every=1)
        summary = train(config, str(tmp_path / impl), verbose=False)
        assert summary["status"] == "ok"
        losses[impl] = summary
    a, b = losses["cudnn"], losses["chunked"]
    assert abs(a["eval_loss"] - b["eval_loss"]) < 0.02 * b["eval_loss"], (a, b)
    assert a["eval_loss"] < np.log(384) - 0.5, a  # fell from ln V (259 byte ids padded to 384)
