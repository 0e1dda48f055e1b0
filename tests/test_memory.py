"""The memory estimator against XLA's memory_analysis of the compiled train step (CPU)."""
from __future__ import annotations

import jax
import pytest

from configs import lm
from experiments.bench import build
from transformer.training import memory

# (preset, seq_len, batch, mesh (data, fsdp, tensor), model overrides, train.loss_chunk_size)
CASES = [
    ("default", 128, 8, (1, 1, 1), dict(d_model=128, num_layers=2, d_ff=512), 0),
    ("llama_tiny", 64, 16, (1, 1, 1), {}, 0),
    ("default", 128, 8, (2, 2, 2), dict(d_model=128, num_layers=2, d_ff=512), 0),
    # a vocabulary whose logits would be most of the step's memory unchunked (XLA: ~160 MB unchunked, ~68 MB
    # in chunks of 32 positions): the chunked loss's estimate against XLA, as the plain path's
    ("default", 128, 8, (1, 1, 1), dict(d_model=64, num_layers=1, d_ff=256, vocab_size=16384), 32),
]


def _config(preset: str, seq_len: int, batch: int, mesh: tuple[int, int, int], model: dict, chunk: int = 0):
    c = lm.get_config(preset)
    c.data.seq_len, c.train.batch_size = seq_len, batch
    c.model.update(model)
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
    c.train.loss_chunk_size = chunk
    return c


@pytest.mark.slow
@pytest.mark.parametrize("preset,seq_len,batch,mesh,model,chunk", CASES)
def test_estimate_matches_xla(preset, seq_len, batch, mesh, model, chunk):
    c = _config(preset, seq_len, batch, mesh, model, chunk)
    n = mesh[0] * mesh[1] * mesh[2]
    built = build(c, jax.devices()[:n])
    m = built["compiled"].memory_analysis()
    est = memory.estimate(built["model_cfg"], batch_size=batch, seq_len=seq_len, mesh_shape=mesh,
                          loss_chunk_size=chunk)
    # The step's arguments are the state (params + two AdamW moments, float32) and the batch.
    batch_bytes = 5 * 4 * batch // (mesh[0] * mesh[1]) * seq_len
    state_bytes = m.argument_size_in_bytes - batch_bytes
    assert est["params"] + est["optimizer"] == pytest.approx(state_bytes, rel=0.02)
    xla_total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    assert est["total"] == pytest.approx(xla_total, rel=0.30)


def test_remat_and_chunking_order():
    from transformer.training.resolve import model_config

    cfg = model_config(lm.get_config("default"), 259)
    totals = {r: memory.estimate(cfg.replace(remat=r), batch_size=16, seq_len=256)["activations"]
              for r in ("none", "full", "dots", "dots_no_batch")}
    assert totals["full"] < totals["dots_no_batch"] < totals["dots"] < totals["none"]
    plain = memory.estimate(cfg, batch_size=16, seq_len=256)["logits"]
    chunked = memory.estimate(cfg, batch_size=16, seq_len=256, loss_chunk_size=64)["logits"]
    assert chunked < plain  # how much less: against XLA in test_estimate_matches_xla
    flash = memory.estimate(cfg.replace(attention_impl="cudnn", dtype="bfloat16"), batch_size=16, seq_len=256)
    assert flash["activations"] < memory.estimate(cfg, batch_size=16, seq_len=256)["activations"] / 2


def test_mesh_divides_per_device_memory():
    from transformer.training.resolve import model_config

    cfg = model_config(lm.get_config("default"), 259)
    one = memory.estimate(cfg, batch_size=16, seq_len=256)
    eight = memory.estimate(cfg, batch_size=16, seq_len=256, mesh_shape=(2, 2, 2))
    assert eight["activations"] < one["activations"] / 3
    assert one["params"] / 4 <= eight["params"] < one["params"] / 2
    with pytest.raises(ValueError, match="batch_size"):
        memory.estimate(cfg, batch_size=6, seq_len=256, mesh_shape=(4, 1, 1))
