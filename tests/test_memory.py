"""The memory estimator against XLA's memory_analysis of the compiled train step (CPU, float32, scanned layers)."""
from __future__ import annotations

import jax
import pytest

from configs import lm
from cli_modules import cli_module

build = cli_module("bench").build
from transformer.spec import REMAT_POLICIES
from transformer.training import memory

SMALL_LLAMA = dict(d_model=256, num_layers=4, num_heads=4, num_kv_heads=2, d_ff=704, vocab_size=2048)
SMALL_GPT2 = dict(d_model=128, num_layers=3, d_ff=512)
# (preset, model overrides, seq_len, batch, mesh (data, fsdp, tensor), train.loss_chunk_size, grad_accum_steps)
SHAPES = {
    "llama": ("llama_small", SMALL_LLAMA, 256, 8, (1, 1, 1), 0, 1),
    "gpt2": ("default", SMALL_GPT2, 128, 8, (1, 1, 1), 0, 1),
    "llama_long": ("llama_small", dict(SMALL_LLAMA, num_layers=8, d_model=384, num_heads=6, num_kv_heads=6,
                                       d_ff=1024), 512, 4, (1, 1, 1), 0, 1),
    # gradient accumulation over 2 micro-batches with the chunked loss
    "llama_accum_chunked": ("llama_small", SMALL_LLAMA, 256, 8, (1, 1, 1), 64, 2),
    # a vocabulary whose logits are most of the step's memory, plain and in chunks of 32 positions
    "big_vocab": ("default", dict(d_model=64, num_layers=1, d_ff=256, vocab_size=16384), 128, 8, (1, 1, 1), 0, 1),
    "big_vocab_chunked": ("default", dict(d_model=64, num_layers=1, d_ff=256, vocab_size=16384), 128, 8, (1, 1, 1),
                          32, 1),
    "gpt2_mesh": ("default", SMALL_GPT2, 128, 8, (2, 2, 2), 0, 1),
}
CASES = ([(shape, remat) for shape in ("llama", "gpt2") for remat in REMAT_POLICIES]
         + [("llama_long", "none"), ("llama_long", "dots_no_batch"), ("llama_accum_chunked", "none"),
            ("llama_accum_chunked", "dots_no_batch"), ("big_vocab", "none"), ("big_vocab_chunked", "none"),
            ("gpt2_mesh", "none"), ("gpt2_mesh", "dots_no_batch")])


def _config(shape: str, remat: str):
    preset, model, seq_len, batch, mesh, chunk, accum = SHAPES[shape]
    c = lm.get_config(preset)
    c.data.seq_len, c.train.batch_size = seq_len, batch
    c.model.update(model)
    c.model.update(remat=remat, scan_layers=True, attention_impl="chunked")
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
    c.train.update(loss_chunk_size=chunk, grad_accum_steps=accum, compute_dtype="float32")
    return c


@pytest.mark.slow
@pytest.mark.parametrize("shape,remat", CASES)
def test_estimate_matches_xla(shape, remat):
    """Within ±15% of XLA's own buffer sizes (arguments + outputs − aliased + temporaries), every remat policy.
    float32: XLA:CPU computes bfloat16 in float32 and keeps float32 copies of bfloat16 activations, which a GPU
    does not (the bfloat16 check is the H100's allocator peak, BENCHMARKS.md)."""
    c = _config(shape, remat)
    mesh = SHAPES[shape][4]
    n = mesh[0] * mesh[1] * mesh[2]
    built = build(c, jax.devices()[:n])
    m = built["compiled"].memory_analysis()
    est = memory.estimate_from_config(c, built["model_cfg"].vocab_size, n)
    assert est["grad_accum_steps"] == c.train.grad_accum_steps
    # The step's arguments are the state (params + two AdamW moments, float32) and the batch.
    batch_bytes = 5 * 4 * c.train.batch_size // (mesh[0] * mesh[1]) * c.data.seq_len
    state_bytes = m.argument_size_in_bytes - batch_bytes
    assert est["params"] + est["optimizer"] == pytest.approx(state_bytes, rel=0.02)
    xla_total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    assert est["total"] == pytest.approx(xla_total, rel=0.15)


def _cfg(**model):
    from transformer.training.resolve import model_config

    c = lm.get_config("default")
    c.model.attention_impl = "chunked"
    return model_config(c, 259).replace(**model)


def test_remat_and_chunking_order():
    cfg = _cfg()
    totals = {r: memory.estimate(cfg.replace(remat=r), batch_size=16, seq_len=256)["activations"]
              for r in REMAT_POLICIES}
    assert totals["full"] < totals["dots_no_batch"] < totals["dots_no_batch_attention"] < totals["none"]
    assert totals["dots_no_batch"] < totals["dots"] < totals["none"]
    plain = memory.estimate(cfg, batch_size=16, seq_len=256)["logits"]
    chunked = memory.estimate(cfg, batch_size=16, seq_len=256, loss_chunk_size=64)["logits"]
    assert chunked == plain / 4  # B·chunk·V instead of B·T·V; against XLA in test_estimate_matches_xla
    bf16 = cfg.replace(dtype="bfloat16")
    flash = memory.estimate(bf16.replace(attention_impl="cudnn"), batch_size=16, seq_len=256)["activations"]
    assert flash < memory.estimate(bf16, batch_size=16, seq_len=256)["activations"]  # no T² softmax parts


def test_cudnn_standin_keeps_what_jax_cudnn_keeps():
    """Off the GPU cuDNN attention is traced through a stand-in with the residuals of jax's cuDNN rule: q, k, v
    (bfloat16, after RoPE), the output and float32 statistics (B, N, T); nothing of size T²."""
    cfg = _cfg(attention_impl="cudnn", dtype="bfloat16")
    B, T, N, K, H = 2, 256, cfg.num_heads, cfg.kv_heads, cfg.dim_per_head
    flash = memory.block_residual_bytes(cfg, B, T)
    chunked = memory.block_residual_bytes(cfg.replace(attention_impl="chunked"), B, T)
    assert chunked - flash > 4 * B * N * T * T / 2  # chunked keeps softmax pieces of about half of T² (causal)
    with_out = memory.block_residual_bytes(cfg.replace(remat="dots_no_batch_attention"), B, T)
    without = memory.block_residual_bytes(cfg.replace(remat="dots_no_batch"), B, T)
    # the policy adds what cuDNN's backward reads beyond the projections' outputs: q and k after RoPE... at least
    # the float32 statistics and the output
    assert with_out - without >= 4 * B * N * T + 2 * B * T * N * H


def test_grad_accum_counts_micro_batches_and_the_accumulator():
    cfg = _cfg()
    one = memory.estimate(cfg, batch_size=16, seq_len=256)
    four = memory.estimate(cfg, batch_size=16, seq_len=256, grad_accum_steps=4)
    assert one["grad_accum"] == 0 and four["grad_accum"] == four["params"]
    assert four["micro_batch_per_device"] == 4 and four["batch_per_device"] == 16
    assert four["activations"] == pytest.approx(one["activations"] / 4, rel=0.05)
    assert four["logits"] == one["logits"] / 4
    with pytest.raises(ValueError, match="grad_accum_steps=3"):
        memory.estimate(cfg, batch_size=16, seq_len=256, grad_accum_steps=3)


def test_mesh_divides_per_device_memory():
    cfg = _cfg()
    one = memory.estimate(cfg, batch_size=16, seq_len=256)
    eight = memory.estimate(cfg, batch_size=16, seq_len=256, mesh_shape=(2, 2, 2))
    assert eight["activations"] < one["activations"] / 3
    assert one["params"] / 4 <= eight["params"] < one["params"] / 2
    with pytest.raises(ValueError, match="batch_size"):
        memory.estimate(cfg, batch_size=6, seq_len=256, mesh_shape=(4, 1, 1))
