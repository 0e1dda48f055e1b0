"""Per-device memory of a training step, estimated from the config alone (no model is built).

Legend: B batch (per device), T sequence, D d_model, N query heads, K key/value heads, H head dim,
F d_ff, V vocabulary, L layers, P parameters; s = bytes of the compute dtype, 4 = float32.

  parameters      4 bytes each (float32); weight matrices and the token table split over fsdp·tensor
                  (embed over fsdp; heads, mlp, vocab over tensor), a learned position table over
                  fsdp only, norm scales and biases counted whole (replicated: an upper bound)
  gradients       as the parameters (live during the update); under LoRA only the trained ones (the adapters
                  and a classifier's head: spec.accounting's "trainable", split like the kernels)
  optimizer       AdamW: two float32 moments per trained parameter, sharded like it
  activations     what the backward pass keeps, per token and layer:
      remat none           s·(4D + 2·N·H + 2·K·H + F_act) + 4·c·N·T   (c attention-score buffers:
                           3 for the einsum/xla softmax — scores, masked scores, probabilities —,
                           1 for "chunked" (probabilities only; an upper bound, as causal chunks
                           keep fewer), and 0 for cuDNN flash attention, which keeps only a
                           log-sum-exp, 4·N)
                           F_act = 2F plain (pre-activation, activation), 4F gated (gate, up,
                           activation, product); heads and F divided by tensor
      remat full           s·D (each block's input) + one block's "none" activations, recomputed
      remat dots           the matmul outputs: s·(2·N·H + 2·K·H + D + F_mm) + 4·N·T for QKᵀ, plus
                           one block's "none" activations; F_mm = F plain, 2F gated
      remat dots_no_batch  as dots without the batched attention matmuls (QKᵀ, PV)
                    times B·T·L, plus the head: 3 × B·T·V float32 logits (logits, softmax, their
                    gradient), or B·chunk·V with train.loss_chunk_size.
  working set     one layer's backward temporaries ≈ one block's "none" activations.

The test (tests/test_memory.py) compares the total with XLA's memory_analysis of the compiled train
step on CPU: within ±30% for remat none, within ±2% for parameters + optimizer state (the step's
arguments). XLA:CPU's buffer assignment does not show the savings of rematerialisation (its temp
size grows slightly with remat), so the remat rows are the model above, checked on CPU only for
their order (full < dots_no_batch ≤ dots < none).
"""
from __future__ import annotations

from typing import Any

from transformer.spec import ModelConfig
from transformer.spec import matmul_params, param_counts

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _per_token_layer(cfg: ModelConfig, seq_len: int, tensor: int) -> dict[str, float]:
    """Bytes kept per token and layer for each remat policy (tensor-parallel parts divided)."""
    s = _BYTES[cfg.dtype]
    D, N, K, H, F, T = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.dim_per_head, cfg.d_ff, seq_len
    heads = (2 * N * H + 2 * K * H) / tensor
    f_act = (4 if cfg.gated else 2) * F / tensor
    f_mm = (2 if cfg.gated else 1) * F / tensor
    flash = cfg.attention_impl == "cudnn"
    buffers = {"chunked": 1}.get(cfg.attention_impl, 3)
    scores = (4 * N / tensor) if flash else 4 * buffers * N * T / tensor
    none = s * (4 * D + heads + f_act) + scores
    qk_scores = 0 if flash else 4 * N * T / tensor
    dots_no_batch = s * (heads + D + f_mm)
    return {"none": none, "full": s * D, "dots": dots_no_batch + qk_scores, "dots_no_batch": dots_no_batch}


def _sharded_param_count(cfg: ModelConfig, fsdp: int, tensor: int) -> float:
    """Parameters held by one device under the default rules."""
    counts = param_counts(cfg)
    token = cfg.vocab_size * cfg.d_model
    position = counts["embedding"] - token
    head = 0 if cfg.tie_embeddings else token
    blocks = matmul_params(cfg) - token
    other = counts["total"] - token - position - head - blocks
    return (token + head + blocks) / (fsdp * tensor) + position / fsdp + other


def estimate(cfg: ModelConfig, *, batch_size: int, seq_len: int, mesh_shape: tuple[int, int, int] = (1, 1, 1),
             loss_chunk_size: int = 0) -> dict[str, Any]:
    """Bytes per device: params, grads, optimizer, activations, logits, total (and the inputs used).

    batch_size is global; mesh_shape is (data, fsdp, tensor) with the default rules (batch over
    data·fsdp; embed over fsdp; heads, mlp, vocab over tensor).
    """
    data, fsdp, tensor = mesh_shape
    if batch_size % (data * fsdp):
        raise ValueError(f"batch_size={batch_size} does not split over data*fsdp={data * fsdp} devices")
    params = 4.0 * _sharded_param_count(cfg, fsdp, tensor)
    trained = 4.0 * param_counts(cfg)["trainable"] / (fsdp * tensor) if cfg.lora.rank else params
    tokens = batch_size // (data * fsdp) * seq_len
    per = _per_token_layer(cfg, seq_len, tensor)
    kept = per[cfg.remat] * cfg.num_layers * tokens
    working = per["none"] * tokens if cfg.remat != "none" else 0.0
    working += per["none"] * tokens  # the layer whose backward is running: its gradients' temporaries
    logit_rows = tokens if not loss_chunk_size else tokens // seq_len * loss_chunk_size
    logits = 3 * 4.0 * logit_rows * cfg.vocab_size / tensor
    out = {"params": params, "grads": trained, "optimizer": 2 * trained, "activations": kept + working,
           "logits": logits}
    out["total"] = sum(out.values())
    out.update(batch_per_device=batch_size // (data * fsdp), seq_len=seq_len, remat=cfg.remat,
               mesh=dict(zip(("data", "fsdp", "tensor"), mesh_shape)))
    return out


def estimate_from_config(config: Any, vocab_size: int, num_devices: int) -> dict[str, Any]:
    """`estimate` for a full training config (model, data.seq_len, train.batch_size, mesh)."""
    from transformer.training import sharding
    from transformer.training.resolve import model_config

    cfg = model_config(config, vocab_size)
    return estimate(cfg, batch_size=config.train.batch_size, seq_len=config.data.seq_len,
                    mesh_shape=sharding.mesh_shape(config.mesh, num_devices),
                    loss_chunk_size=config.train.get("loss_chunk_size", 0))


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
