"""Per-device memory of a training step, estimated from the config: no parameter or activation is allocated.

Legend: B batch per device (per micro-batch with train.grad_accum_steps = k: B/k), T sequence, D d_model,
V vocabulary, L layers, P parameters per device.

  parameters      4 bytes each (float32); weight matrices and the token table split over fsdp·tensor
                  (embed over fsdp; heads, mlp, vocab over tensor), a learned position table over fsdp
                  only, norm scales and biases counted whole (replicated: an upper bound)
  gradients       as the parameters (live during the update); under LoRA only the trained ones (the adapters
                  and a classifier's head: spec.accounting's "trainable", split like the kernels)
  optimizer       AdamW: two float32 moments per trained parameter, sharded like it
  grad_accum      k > 1: one more float32 buffer like the parameters (the scan's running sum of gradients)
  activations     L × what the backward pass reads of one block under the remat policy, plus the working set
                  of the layer whose backward is running (that block's residuals without remat). "What the
                  backward reads" is not a formula: it is the residuals of jax.vjp of one TransformerBlock,
                  traced abstractly (jax.make_jaxpr, shapes only) at the per-device shape (B, T, D, the heads
                  and d_ff divided by tensor) under jax.checkpoint with the model's policy; the block's input
                  counts (under scan_layers it is stacked L times), the parameters do not (counted above),
                  their compute-dtype copies do. So it follows the layers as written (float32 norm
                  statistics, RoPE tables, the gated FFN's pieces, each attention implementation's own
                  residuals) and each remat policy exactly as jax applies it. cuDNN attention cannot be
                  traced without a GPU; elsewhere a stand-in with jax's cuDNN residuals (q, k, v, the output
                  and float32 softmax statistics of B·N·T) takes its place.
  logits          2 × B·T·V float32 (the logits and their gradient, into which XLA fuses the softmax), or
                  B·chunk·V with loss_chunk_size.

Checked (tests/test_memory.py) against XLA's memory_analysis of the compiled train step on CPU, float32, scanned
layers: within ±15% for every remat policy at a few small shapes (0.97-1.13 measured). XLA:CPU without scan_layers keeps every activation
whatever the policy (its buffer assignment shows no saving), so the check uses scanned layers, as the GPU
benchmark does. On a GPU the bench prints this estimate beside the allocator's peak.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

from transformer.spec import ModelConfig
from transformer.spec import matmul_params, param_counts

# The working set of the layer whose backward is running, as shares of one layer's residuals without remat:
# RECOMPUTED_LIVE of what it recomputes (those residuals less the ones the policy saved; XLA fuses the rest into
# its consumers) and GRADIENT_LIVE for the gradients of its activations. Empirical, not derived: with them the
# total reads 0.97-1.13 of XLA's memory analysis in the 18 CPU cases of tests/test_memory.py (float32) and
# +4%, +6%, +8% of the three allocator peaks measured on an H100 on 2026-11-26 (BENCHMARKS.md), which were
# seen when they were chosen and so are no independent check; new peaks are (the bench prints both).
RECOMPUTED_LIVE = 0.55
GRADIENT_LIVE = 0.4


def _sharded_param_count(cfg: ModelConfig, fsdp: int, tensor: int) -> float:
    """Parameters held by one device under the default rules."""
    counts = param_counts(cfg)
    token = cfg.vocab_size * cfg.d_model
    position = counts["embedding"] - token
    head = 0 if cfg.tie_embeddings else token
    blocks = matmul_params(cfg) - token
    other = counts["total"] - token - position - head - blocks
    return (token + head + blocks) / (fsdp * tensor) + position / fsdp + other


def _local_block_config(cfg: ModelConfig, tensor: int) -> ModelConfig:
    """The block one device computes: query heads, key/value heads (when they split) and d_ff over tensor."""
    if tensor == 1:
        return cfg
    kv = cfg.kv_heads // tensor if cfg.kv_heads % tensor == 0 else cfg.kv_heads
    return cfg.replace(num_heads=max(1, cfg.num_heads // tensor), num_kv_heads=max(1, kv),
                       d_ff=max(1, cfg.d_ff // tensor), head_dim=cfg.dim_per_head)


def _flash_standin() -> Any:
    """cuDNN attention's stand-in off the GPU, for tracing only: the einsum's values, cuDNN's residuals (jax's
    _dot_product_attention_fwd_rule keeps q, k, v, the output and float32 statistics of shape (B, N, T))."""
    import jax
    import jax.numpy as jnp

    from transformer.layers.sdpa import ATTENTION_IMPLEMENTATIONS

    einsum = ATTENTION_IMPLEMENTATIONS["einsum"]

    def standin(q_BTNH, k_BSKH, v_BSKH, **flags):
        @jax.custom_vjp
        def attend(q, k, v):
            return einsum(q, k, v, **flags)

        def forward(q, k, v):
            out = attend(q, k, v)
            B, T, N, _ = q.shape
            return out, (q, k, v, out, jnp.zeros((B, N, T), jnp.float32))

        def backward(res, dout):
            q, k, v, _, _ = res
            return q, k, v

        attend.defvjp(forward, backward)
        return attend(q_BTNH, k_BSKH, v_BSKH)

    return standin


@contextlib.contextmanager
def _traceable_attention(cfg: ModelConfig) -> Iterator[None]:
    """cuDNN attention replaced by _flash_standin while tracing, where jax has no cuDNN (any non-GPU backend)."""
    import jax

    from transformer.layers.sdpa import ATTENTION_IMPLEMENTATIONS, resolve_attention_impl

    if resolve_attention_impl(cfg) != "cudnn" or jax.default_backend() == "gpu":
        yield
        return
    real = ATTENTION_IMPLEMENTATIONS["cudnn"]
    ATTENTION_IMPLEMENTATIONS["cudnn"] = _flash_standin()
    try:
        yield
    finally:
        ATTENTION_IMPLEMENTATIONS["cudnn"] = real


@functools.lru_cache(maxsize=256)
def block_residual_bytes(cfg: ModelConfig, batch: int, seq_len: int, *, causal: bool = True,
                         cross_attention: bool = False) -> float:
    """Bytes the backward pass reads of one TransformerBlock of `cfg` (its remat policy) on a (batch, seq_len)
    input: the residuals of jax.vjp traced abstractly, each array once; the block's input counts, its
    parameters and the other inputs (positions, segment ids, context, a position bias: not per layer) do not."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.extend.core import Literal

    from transformer.layers import positional
    from transformer.layers.dtypes import compute_dtypes
    from transformer.models.blocks import REMAT_POLICIES, TransformerBlock

    dtype, _ = compute_dtypes(cfg)
    block = TransformerBlock(cfg, causal=causal, cross_attention=cross_attention)
    x = jax.ShapeDtypeStruct((batch, seq_len, cfg.d_model), dtype)
    ints = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    context = x if cross_attention else None
    bias = (jax.ShapeDtypeStruct((1, cfg.num_heads, seq_len, seq_len), jnp.float32)
            if cfg.positional in positional.BIAS else None)
    others = (ints, ints, context, ints if cross_attention else None, bias)
    with _traceable_attention(cfg):
        params = jax.eval_shape(lambda *a: block.init(jax.random.PRNGKey(0), *a), x, *others)

        def residuals(p, x, *rest):  # differentiated in the parameters and the input only
            apply = lambda p, x: block.apply(p, x, *rest)
            if cfg.remat != "none":
                apply = jax.checkpoint(apply, policy=REMAT_POLICIES[cfg.remat])
            return jax.vjp(apply, p, x)

        closed, shapes = jax.make_jaxpr(residuals, return_shape=True)(params, x, *others)
    residuals = closed.jaxpr.outvars[len(closed.jaxpr.outvars) - len(jax.tree.leaves(shapes[1])):]
    n_params = len(jax.tree.leaves(params))
    not_per_layer = set(closed.jaxpr.invars[:n_params]) | set(closed.jaxpr.invars[n_params + 1:])
    total, seen = 0.0, set()
    for v in residuals:
        if isinstance(v, Literal) or v in seen or v in not_per_layer or v in closed.jaxpr.constvars:
            continue
        seen.add(v)
        total += float(np.prod(v.aval.shape)) * v.aval.dtype.itemsize
    return total


def _stacks(cfg: ModelConfig) -> list[tuple[int, bool, bool]]:
    """(layers, causal, cross-attention) of each block stack of the family."""
    if cfg.family == "encoder_decoder":
        return [(cfg.encoder_layers, False, False), (cfg.num_layers, True, True)]
    return [(cfg.num_layers, cfg.family == "decoder", False)]


def estimate(cfg: ModelConfig, *, batch_size: int, seq_len: int, mesh_shape: tuple[int, int, int] = (1, 1, 1),
             loss_chunk_size: int = 0, grad_accum_steps: int = 1) -> dict[str, Any]:
    """Bytes per device: params, grads, optimizer, grad_accum, activations, logits, total (and the inputs used).

    batch_size is global; mesh_shape is (data, fsdp, tensor) with the default rules (batch over
    data·fsdp; embed over fsdp; heads, mlp, vocab over tensor); grad_accum_steps splits each device's rows
    into that many micro-batches, one of which is live at a time.
    """
    data, fsdp, tensor = mesh_shape
    k = int(grad_accum_steps)
    if batch_size % (data * fsdp * k):
        raise ValueError(f"batch_size={batch_size} does not split over data*fsdp={data * fsdp} devices "
                         f"and grad_accum_steps={k} micro-batches")
    params = 4.0 * _sharded_param_count(cfg, fsdp, tensor)
    rows = batch_size // (data * fsdp * k)
    local = _local_block_config(cfg, tensor)
    kept = working = 0.0
    for layers, causal, cross in _stacks(cfg):
        per_layer = block_residual_bytes(local, rows, seq_len, causal=causal, cross_attention=cross)
        kept += layers * per_layer
        whole = block_residual_bytes(local.replace(remat="none"), rows, seq_len, causal=causal,
                                     cross_attention=cross)
        working = max(working, RECOMPUTED_LIVE * (whole - per_layer) + GRADIENT_LIVE * whole)
    logit_rows = rows * (loss_chunk_size or seq_len)
    logits = 2 * 4.0 * logit_rows * cfg.vocab_size / tensor
    trained = 4.0 * param_counts(cfg)["trainable"] / (fsdp * tensor) if cfg.lora.rank else params
    out = {"params": params, "grads": trained, "optimizer": 2 * trained, "grad_accum": trained if k > 1 else 0.0,
           "activations": kept + working, "logits": logits}
    out["total"] = sum(out.values())
    out.update(batch_per_device=batch_size // (data * fsdp), micro_batch_per_device=rows, seq_len=seq_len,
               remat=cfg.remat, grad_accum_steps=k, mesh=dict(zip(("data", "fsdp", "tensor"), mesh_shape)))
    return out


def estimate_from_config(config: Any, vocab_size: int, num_devices: int) -> dict[str, Any]:
    """`estimate` for a full training config (model, data.seq_len, train.batch_size, loss_chunk_size,
    grad_accum_steps, mesh)."""
    from transformer.training import sharding
    from transformer.training.resolve import model_config

    cfg = model_config(config, vocab_size)
    return estimate(cfg, batch_size=config.train.batch_size, seq_len=config.data.seq_len,
                    mesh_shape=sharding.mesh_shape(config.mesh, num_devices),
                    loss_chunk_size=config.train.get("loss_chunk_size", 0),
                    grad_accum_steps=config.train.get("grad_accum_steps", 1))


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
