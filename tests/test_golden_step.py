"""A golden test of one training step (nanodo's style): a fixed tiny model (gpt2_tiny, seq_len 32), a fixed
synthetic batch, train.seed 0, a constant learning rate 1e-3 with no warm-up (so the pinned values do not depend
on how step 1's warm-up rate is chosen), one device. Its loss, gradient norm and the per-module RMS of the
parameters after the step and of the update are pinned to recorded values: a change in the initialisation, a
layer, the loss or the optimizer moves them. If that change was meant, rerun with GOLDEN_PRINT=1 and paste the
printed table into GOLDEN."""
from __future__ import annotations

import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from configs import lm
from transformer.models import build_model
from transformer.tasks import get_task
from transformer.training import sharding, steps
from transformer.training.resolve import model_config
from transformer.training.state import fresh_state, model_optimizer

B, T = 4, 32
# Recorded on CPU with jax 0.10.2; compared to rel 1e-4 on every CPU kind: XLA:CPU sums float32 in another order
# with AVX2 (AMD EPYC) than with AVX-512/AMX (Intel Xeon), which moves these values by ~1e-6 relative; a real
# change (an initialisation, a layer, the loss, the optimizer) moves them by > 1e-3 (docs/sweeps.md, "Reproducing
# figures on another machine"). The values recorded earlier pass on an Intel Xeon with AVX-512/AMX (2026-11-26).
GOLDEN: dict[str, float] = {
    'grad_norm': 1.6661862134933472,
    'loss': 5.964573383331299,
    'rms/params/blocks/layers_0/attention/key': 0.01975085772573948,
    'rms/params/blocks/layers_0/attention/out': 0.010046985931694508,
    'rms/params/blocks/layers_0/attention/query': 0.01999891921877861,
    'rms/params/blocks/layers_0/attention/value': 0.01978261023759842,
    'rms/params/blocks/layers_0/attention_norm': 0.7071074843406677,
    'rms/params/blocks/layers_0/mlp/wi': 0.01980038546025753,
    'rms/params/blocks/layers_0/mlp/wo': 0.010059787891805172,
    'rms/params/blocks/layers_0/mlp_norm': 0.7071737051010132,
    'rms/params/blocks/layers_1/attention/key': 0.01980491913855076,
    'rms/params/blocks/layers_1/attention/out': 0.010036798194050789,
    'rms/params/blocks/layers_1/attention/query': 0.020251231268048286,
    'rms/params/blocks/layers_1/attention/value': 0.01964142918586731,
    'rms/params/blocks/layers_1/attention_norm': 0.707173764705658,
    'rms/params/blocks/layers_1/mlp/wi': 0.01990773342549801,
    'rms/params/blocks/layers_1/mlp/wo': 0.00999927707016468,
    'rms/params/blocks/layers_1/mlp_norm': 0.7070853114128113,
    'rms/params/final_norm': 0.7069306969642639,
    'rms/params/position_embedding': 0.020066188648343086,
    'rms/params/token_embedding': 0.020043272525072098,
    'rms/updates/blocks/layers_0/attention/key': 0.0009898683056235313,
    'rms/updates/blocks/layers_0/attention/out': 0.00099997001234442,
    'rms/updates/blocks/layers_0/attention/query': 0.0009977917652577162,
    'rms/updates/blocks/layers_0/attention/value': 0.0009999501053243876,
    'rms/updates/blocks/layers_0/attention_norm': 0.0009998774621635675,
    'rms/updates/blocks/layers_0/mlp/wi': 0.0009999275207519531,
    'rms/updates/blocks/layers_0/mlp/wo': 0.0009999691974371672,
    'rms/updates/blocks/layers_0/mlp_norm': 0.0009999232133850455,
    'rms/updates/blocks/layers_1/attention/key': 0.000989463529549539,
    'rms/updates/blocks/layers_1/attention/out': 0.0009999724570661783,
    'rms/updates/blocks/layers_1/attention/query': 0.0009970803512260318,
    'rms/updates/blocks/layers_1/attention/value': 0.0009999102912843227,
    'rms/updates/blocks/layers_1/attention_norm': 0.0009998257737606764,
    'rms/updates/blocks/layers_1/mlp/wi': 0.0009998915484175086,
    'rms/updates/blocks/layers_1/mlp/wo': 0.0009999678004533052,
    'rms/updates/blocks/layers_1/mlp_norm': 0.0009998269379138947,
    'rms/updates/final_norm': 0.000999953132122755,
    'rms/updates/position_embedding': 0.00012501896708272398,
    'rms/updates/token_embedding': 0.0009999820031225681,
}


def _batch(vocab: int) -> dict[str, np.ndarray]:
    """B rows of two packed documents each, random tokens from a fixed generator."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, vocab, size=(B, T + 1)).astype(np.int32)
    segment_ids = np.ones((B, T), np.int32)
    segment_ids[:, T // 2:] = 2
    positions = np.concatenate([np.arange(T // 2), np.arange(T - T // 2)])[None].repeat(B, 0).astype(np.int32)
    weights = np.ones((B, T), np.float32)
    weights[:, T // 2 - 1] = 0.0  # no target across the document boundary
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": segment_ids, "positions": positions,
            "weights": weights}


def _one_step() -> dict[str, float]:
    c = lm.get_config("gpt2_tiny")
    c.data.seq_len = T
    c.train.update(batch_size=B, learning_rate=1e-3, warmup_steps=0, schedule="constant", seed=0)
    model, task = build_model(model_config(c, 259)), get_task(c)
    mesh, rules = sharding.make_mesh(c.mesh, jax.devices()[:1]), sharding.rules(c.mesh)
    tx = model_optimizer(model, c.train, task.init_inputs(c))
    state = fresh_state(model, tx, c.train, task.init_inputs(c), mesh, rules)
    train_fn = jax.jit(steps.make_train_step(model, task, tx, seed=0, use_dropout=False))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        _, m = train_fn(state, _batch(256))
    m = jax.device_get(m)
    out = {"loss": float(m["loss"]), "grad_norm": float(m["grad_norm"])}
    for kind in ("params", "updates"):
        out.update({f"rms/{kind}/{module}": float(v) for module, v in m["rms"][kind].items()})
    return out


def test_one_training_step_matches_the_recorded_values():
    got = _one_step()
    if os.environ.get("GOLDEN_PRINT"):
        print("GOLDEN = {\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in sorted(got.items())) + "}")
    changed = {k: (GOLDEN.get(k), got.get(k)) for k in sorted(set(GOLDEN) | set(got))
               if k not in GOLDEN or k not in got or got[k] != pytest.approx(GOLDEN[k], rel=1e-4, abs=1e-9)}
    assert not changed, (
        "one training step of the fixed tiny model no longer gives the recorded values "
        "(key: (recorded, now)):\n" + "\n".join(f"  {k}: {v}" for k, v in changed.items()) +
        "\nWas the model (initialisation, layers, loss) or the optimizer meant to change? If so, rerun with "
        "GOLDEN_PRINT=1 -s and paste the printed table into GOLDEN in tests/test_golden_step.py; if not, "
        "this is the regression.")


def test_the_loop_logs_each_modules_rms_at_log_steps(tiny_lm_run):
    """metrics.jsonl rows carry rms/{params,grads,updates}/<module>; the parameters' RMS at the last step equals
    the RMS of the checkpointed parameters of that step, computed here in numpy."""
    from transformer.training.metrics import read_metrics
    from transformer.training.restore import load_run

    rows = read_metrics(tiny_lm_run)
    run = load_run(tiny_lm_run)
    assert rows[-1]["step"] == run.step
    per_module: dict[str, list[np.ndarray]] = {}
    for path, x in jax.tree_util.tree_leaves_with_path(jax.device_get(run.params)):
        names = [str(k.key) for k in path]
        per_module.setdefault("/".join(names[:-1]), []).append(np.asarray(x, np.float64).ravel())
    expected = {m: float(np.sqrt(np.mean(np.concatenate(xs) ** 2))) for m, xs in per_module.items()}
    for row in rows:
        for kind in ("params", "grads", "updates"):
            assert {k.split("/", 2)[2] for k in row if k.startswith(f"rms/{kind}/")} == set(expected), row["step"]
    logged = {k.split("/", 2)[2]: v for k, v in rows[-1].items() if k.startswith("rms/params/")}
    assert logged == pytest.approx(expected, rel=1e-5)

