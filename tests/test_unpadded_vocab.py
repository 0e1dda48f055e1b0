"""N without the vocabulary's padding rows (issue 19, hole 13): the byte tokenizer's 259 ids are padded to 384, and
the 125 rows no token uses are counted in N (16% of N at d16). Runs record the real vocabulary and
params_unpadded, and a sweep's fit reports N without the padding as a convention beside the headline."""
from __future__ import annotations

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.lm import PRESETS, get_config
from sweep_fixture import write_sweep
from transformer.spec import ModelConfig
from transformer.models import build_model
from transformer.scaling import conventions, points, report
from transformer.spec import param_counts
from transformer.sweeps import execute
from transformer.training import run_io

REAL_V, PADDED_V = 259, 384  # the byte tokenizer's ids, and the model's after padding to a multiple of 128


def _built_size(cfg: ModelConfig) -> int:
    """Parameters of the Flax model cfg builds (an independent route: no accounting formula)."""
    boxed = jax.eval_shape(build_model(cfg).init, jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nn.unbox(boxed["params"]))))


def _summary(cfg: ModelConfig, vocab: int) -> dict:
    return run_io.make_summary(status="ok", error=None, step=1, steps=1, counts=param_counts(cfg),
                               tokens_per_step=8, fpt=1.0, last={}, task_name="lm", skipped=None,
                               seconds={"wall": 1.0}, tps=None, num_devices=1, mesh_shape=(1, 1, 1),
                               model_cfg=cfg, vocab_size_unpadded=vocab)


@pytest.mark.parametrize("model", [
    dict(PRESETS["gpt2_tiny"]),                                       # tied head
    dict(PRESETS["llama_tiny"], tie_embeddings=False),                # untied head: its padding columns too
    dict(PRESETS["gpt2_tiny"], family="encoder", use_bias=True),      # masked-LM head with an output bias
])
def test_params_unpadded_is_the_count_of_the_model_with_the_real_vocabulary(model):
    padded = ModelConfig(**{**model, "vocab_size": PADDED_V})
    summary = _summary(padded, REAL_V)
    assert summary["vocab_size"] == PADDED_V and summary["vocab_size_unpadded"] == REAL_V
    assert summary["params"] == _built_size(padded)
    assert summary["params_unpadded"] == _built_size(ModelConfig(**{**model, "vocab_size": REAL_V}))


@pytest.mark.slow  # CI's 15 minutes: 14 s of the default run on 2 loaded cores (2026-11-27)
def test_a_run_and_its_sweep_row_record_the_real_vocabulary(tmp_path, corpus_dir):
    from transformer.training.loop import train

    config = get_config("gpt2_tiny")
    config.data.update(data_dir=corpus_dir, tokenizer="bytes", seq_len=16)
    config.train.update(steps=2, warmup_steps=1, batch_size=8, eval_every=2, eval_steps=1, checkpoint_every=2,
                        log_every=1)
    summary = train(config, str(tmp_path / "run"), verbose=False)
    real = ModelConfig.from_dict({**config.model.to_dict(), "vocab_size": REAL_V})
    assert summary["vocab_size_unpadded"] == REAL_V and summary["vocab_size"] == PADDED_V
    assert summary["params_unpadded"] == _built_size(real) < summary["params"]
    written = json.load(open(tmp_path / "run" / "summary.json"))
    assert written["params_unpadded"] == summary["params_unpadded"]
    run = {k: 0 for k in ("budget", "params", "params_non_embedding", "size", "tokens", "flops", "flops_per_token",
                          "steps", "batch_size", "seq_len", "learning_rate", "warmup_steps", *execute.SHAPE_KEYS)}
    row = execute.result_row({**run, "run_id": "r"}, summary, "ok", None, 1.0, "isoflop")
    assert row["params_unpadded"] == summary["params_unpadded"] and row["vocab_size_unpadded"] == REAL_V


def test_the_fit_reports_n_without_the_padding_beside_the_headline(tmp_path):
    rows = write_sweep(str(tmp_path / "sweep"), seeds=1)
    pad = 125  # rows of an untied 2-table model no token uses: 2·d parameters each
    with open(tmp_path / "sweep" / "results.jsonl", "w") as f:
        f.writelines(json.dumps({**r, "params_unpadded": r["params"] - 2 * pad * r["d_model"]}) + "\n" for r in rows)
    fit = report.run_fit(str(tmp_path / "sweep"), str(tmp_path / "fit"), make_plots=False)
    assert fit["headline"]["convention"] == "eff" and "unpadded" in fit["conventions"]
    unpadded, total = fit["conventions"]["unpadded"]["approach2"]["a"], fit["conventions"]["total"]["approach2"]["a"]
    assert unpadded is not None and unpadded != pytest.approx(total, abs=1e-4)
    text = report.summary(fit)
    assert f"beside the headline: N without the vocabulary's padding rows (convention unpadded): approach2 " \
           f"a = {unpadded:.3f}" in text
    pts = conventions.apply(points.load(str(tmp_path / "sweep")), "unpadded")
    by_id = {r["run_id"]: r["params"] - 2 * pad * r["d_model"] for r in rows}
    assert all(n == by_id[i] for n, i in zip(pts.params_P, pts.ids))
    assert os.path.exists(tmp_path / "fit" / "fit.json")
