"""The remat policy "dots_no_batch_attention" (models/blocks.py): the matmuls without a batch dimension plus
everything the attention's backward reads, named ATTENTION_OUT; same gradients as no remat, and no rerun of the
attention in the backward pass."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from transformer.layers.sdpa import ATTENTION_OUT
from transformer.models.blocks import REMAT_POLICIES, TransformerBlock
from transformer.models.decoder import DecoderLM
from transformer.spec import ModelConfig
from transformer.spec import REMAT_POLICIES as REMAT_NAMES

B, T = 2, 16
LLAMA = ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64, max_len=T,
                    positional="rope", norm="rmsnorm", activation="swiglu", use_bias=False, tie_embeddings=False)
POLICY = "dots_no_batch_attention"


def test_every_named_policy_has_a_definition():
    assert set(REMAT_NAMES) == {"none", *REMAT_POLICIES}


@pytest.mark.parametrize("impl,scan", [("chunked", False), ("einsum", False), ("einsum", True),
                                       pytest.param("chunked", True, marks=pytest.mark.slow)],  # each axis stays covered
                         ids=["layers-chunked", "layers-einsum", "scan-einsum", "scan-chunked"])
def test_same_gradients_as_without_remat(impl, scan):
    tok = jax.random.randint(jax.random.PRNGKey(0), (B, T), 0, LLAMA.vocab_size)
    cfg = LLAMA.replace(attention_impl=impl, scan_layers=scan)
    params = DecoderLM(cfg).init(jax.random.PRNGKey(1), tok)

    def grads(remat: str):
        model = DecoderLM(cfg.replace(remat=remat))
        loss = lambda p: jnp.mean(jax.nn.log_softmax(model.apply(p, tok))[..., 0])
        return jax.jit(jax.value_and_grad(loss))(params)

    (l0, g0), (l1, g1) = grads("none"), grads(POLICY)
    assert float(l0) == float(l1)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def _residuals(remat: str, impl: str) -> list[tuple]:
    cfg = LLAMA.replace(attention_impl=impl, remat=remat)
    block = TransformerBlock(cfg, causal=True)
    x = jnp.ones((B, T, cfg.d_model))
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    params = block.init(jax.random.PRNGKey(0), x, pos)
    f = jax.checkpoint(lambda p, x: block.apply(p, x, pos).sum(), policy=REMAT_POLICIES[remat])
    return [(aval, what) for aval, what in saved_residuals(f, params, x) if "argument" not in what]


def test_the_attention_is_not_run_again_in_the_backward_pass():
    """Under dots_no_batch the backward reruns the attention's forward (its output, the out projection's input,
    and its own residuals are not saved); the new policy saves them, named, and only matmul outputs (and the block's int32 constants) besides: the
    chunked attention's float32 softmax parts among them (its backward reads them)."""
    plain = _residuals("dots_no_batch", "chunked")
    assert not any(ATTENTION_OUT in what for _, what in plain)
    saved = _residuals(POLICY, "chunked")
    named = [aval for aval, what in saved if ATTENTION_OUT in what]
    assert all(ATTENTION_OUT in what or "dot_general" in what or "constant" in what for _, what in saved), saved
    assert any(a.dtype == jnp.float32 for a in named)  # the softmax pieces of chunked attention's backward
    assert (B, T, LLAMA.num_heads, LLAMA.dim_per_head) in [a.shape for a in named]  # the attention output
