"""μP (model.parametrization="mup", transformer/layers/mup.py): the coordinate check of Yang et al. 2022 (their
Figure 5 method), μP = SP at the base width, Adam's first step per parameter kind through the training loop,
the initialisation, output and attention multipliers, the classification by logical names, bad settings."""
from __future__ import annotations

import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lm, mlm, seq2seq
from transformer.spec import ConfigError, ModelConfig
from transformer.layers import mup
from transformer.models import build_model
from transformer.tasks import get_task
from transformer.tasks.lm import LMTask
from transformer.training import sharding, steps
from transformer.training.optimizer import make_optimizer
from transformer.training.state import TrainState, init_state, lr_multipliers

BASE = 32
WIDTHS = (32, 64, 128, 256)   # 8x: a quantity scaling like sqrt(width) changes 2.8x over it, like width 8x
SEQ, BATCH, LAYERS = 32, 8, 2
QUANTITIES = ("embedding", *(f"block{i}" for i in range(LAYERS)), "logits")


def _lm_config(width: int, parametrization: str, preset: str = "gpt2_tiny", **model):
    """A `preset`-shaped LM of this width (head dim 16: width grows by heads, as the sweep ladders grow)."""
    c = lm.get_config(preset)
    c.model.update(dict(d_model=width, num_heads=width // 16, num_kv_heads=0, d_ff=4 * width, num_layers=LAYERS,
                        vocab_size=256, max_len=SEQ, parametrization=parametrization, mup_base_width=BASE))
    c.model.update(model)
    c.data.seq_len = SEQ
    # Constant LR, no warm-up, clipping or decay: the steps are Adam's alone.
    c.train.update(dict(batch_size=BATCH, learning_rate=1e-2, schedule="constant", warmup_steps=0, steps=4,
                        grad_clip=0.0, weight_decay=0.0))
    return c


def _text_batches(n: int) -> dict[str, np.ndarray]:
    """n LM batches (a leading axis n) of BATCH rows of SEQ + 1 bytes of real text: the json module's source."""
    with open(json.__file__, "rb") as f:
        data = np.frombuffer(f.read(), np.uint8).astype(np.int32) + 3
    rows = data[:n * BATCH * (SEQ + 1)].reshape(n, BATCH, SEQ + 1)
    shape = (n, BATCH, SEQ)
    return {"inputs": rows[..., :-1], "targets": rows[..., 1:], "weights": np.ones(shape, np.float32),
            "segment_ids": np.ones(shape, np.int32),
            "positions": np.broadcast_to(np.arange(SEQ, dtype=np.int32), shape)}


def coordinates(config) -> np.ndarray:
    """mean |activation| on a fixed batch (rows: before the first and after each of train.steps Adam steps, each on
    a batch of its own; columns:
    QUANTITIES, i.e. the token embedding's output, each block's output, the logits), by the project's model,
    μP initialisation, optimizer with its μP multipliers and train step, compiled as one program."""
    cfg = ModelConfig.from_dict(config.model)
    model, task = build_model(cfg), LMTask()
    inputs = task.init_inputs(config)
    tx = make_optimizer(config.train, lr_multipliers(model, inputs))
    train_step = steps.make_train_step(model, task, tx, seed=0, use_dropout=False)
    batches = _text_batches(config.train.steps + 1)
    batch = jax.tree.map(lambda x: x[-1], batches)  # the probe's batch, never trained on

    def probe(params):
        _, state = model.apply({"params": params}, batch["inputs"], batch["positions"], batch["segment_ids"],
                               capture_intermediates=True)
        seen = state["intermediates"]
        acts = [seen["token_embedding"]["__call__"][0],
                *(seen["blocks"][f"layers_{i}"]["__call__"][0] for i in range(LAYERS)), seen["__call__"][0]]
        return jnp.stack([jnp.mean(jnp.abs(a.astype(jnp.float32))) for a in acts])

    def run(rng):
        params = nn.unbox(mup.rescale_init(cfg, model.init(rng, *inputs)["params"]))  # as training/state.py
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
        train = jax.tree.map(lambda x: x[:-1], batches)
        state, before = jax.lax.scan(lambda s, b: (train_step(s, b)[0], probe(s.params)), state, train)
        return jnp.concatenate([before, probe(state.params)[None]])

    # The cost is XLA's compilation (the program runs in ~0.2 s): LLVM's expensive passes off halve it, and the
    # CPU backend's older (non-"fusion emitter") code generator takes another third off (same coordinates, bit
    # for bit, measured at width 64).
    fast_compile = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
                    "xla_cpu_use_fusion_emitters": False}
    rng = jax.random.PRNGKey(0)
    return np.asarray(jax.jit(run).lower(rng).compile(compiler_options=fast_compile)(rng))


def _slopes(coords: dict[int, np.ndarray]) -> np.ndarray:
    """d log(mean |activation|) / d log(width), least squares over WIDTHS: (steps + 1, quantities)."""
    x = np.log(WIDTHS)
    y = np.log(np.stack([coords[w] for w in WIDTHS]))        # (widths, steps + 1, quantities)
    return np.polyfit(x, y.reshape(len(WIDTHS), -1), 1)[0].reshape(y.shape[1:])


@functools.cache
def _coordinates(parametrization: str, width: int) -> np.ndarray:
    """`coordinates` of the LM at this width and parametrization, computed once per test session."""
    return coordinates(_lm_config(width, parametrization))


def _coordinate_check(parametrization: str) -> dict[int, np.ndarray]:
    """The coordinate check's measurements at every width of WIDTHS (each compiled only when a test asks)."""
    return {w: _coordinates(parametrization, w) for w in WIDTHS}


# Threshold on |slope| for μP: halfway between flat (μP's limit) and the mildest broken scaling, sqrt(width)
# (slope 0.5: SP's init with a constant std, or μP without its 1/sqrt(m) init); a missing LR scaling or output
# multiplier makes the updates' contribution grow like width (slope ~1 and more, compounding over layers).
# Measured here: |slope| <= 0.15 under μP after every step; SP 0.6-0.9 (logits) and 1.1-1.7 (blocks).
FLAT = 0.25


@pytest.mark.slow
def test_coordinates_stay_flat_across_width_under_mup():
    slopes = _slopes(_coordinate_check("mup"))
    assert np.all(np.isfinite(slopes))
    # At initialisation only the logits are allowed to move: μP's readout (× base/width) starts them at a scale
    # that vanishes like 1/sqrt(width) (measured -0.48), the paper's Table 8 init; nothing may grow.
    assert np.all(np.abs(slopes[0, :-1]) < FLAT) and slopes[0, -1] < FLAT, slopes[0]
    trained = slopes[1:]
    worst = np.unravel_index(np.argmax(np.abs(trained)), trained.shape)
    assert np.max(np.abs(trained)) < FLAT, (
        f"μP coordinate check: {QUANTITIES[worst[1]]} after {worst[0] + 1} step(s) scales as "
        f"width^{trained[worst]:.2f}")


@pytest.mark.slow  # CI's time (the default run is at its 15 minutes); -m slow runs it
def test_logits_and_blocks_grow_with_width_under_sp():
    trained = _slopes(_coordinate_check("sp"))[1:]
    logits, blocks = trained[:, -1], trained[:, 1:-1]
    # At least sqrt(width) at every step (measured 0.6-0.9 for the logits, 1.1-1.7 for the blocks).
    assert np.all(logits > 2 * FLAT), f"SP logits scale as width^{logits} after steps 1..4; expected to grow"
    assert np.all(blocks > 2 * FLAT), f"SP block outputs scale as width^{blocks}; expected to grow"


def test_mup_at_its_base_width_is_sp_exactly():
    np.testing.assert_array_equal(_coordinates("mup", BASE), _coordinates("sp", BASE))


@pytest.mark.slow
@pytest.mark.parametrize("broken", ["lr_multiplier", "logit_multiplier", "init_multiplier"])
def test_coordinate_check_fails_without_each_mup_rule(broken, monkeypatch):
    """Each of μP's three rules is needed: with it removed the check above fails (the test has teeth)."""
    monkeypatch.setattr(mup, broken, lambda *args: 1.0)
    slopes = _slopes({w: coordinates(_lm_config(w, "mup")) for w in WIDTHS})
    assert np.max(np.abs(slopes[1:])) > FLAT


def _expected_kind(path: str) -> str:
    """What μP calls each parameter, from its role in the model (not from its logical names)."""
    *_, parent, leaf = path.split("/")
    if leaf in ("bias", "scale", "output_bias"):
        return "vector"
    if leaf == "embedding":   # the token table and learned position tables
        return "input"
    if parent in ("head", "classifier"):  # the untied LM head, the classification head
        return "output"
    return "hidden"           # q, k, v, out, the FFN, the MLM transform, the pooler


@pytest.mark.parametrize("family,preset,changes", [
    ("lm", "gpt2_tiny", {}),                                          # tied head, learned positions, biases
    ("lm", "llama_tiny", {"scan_layers": True}),                      # untied head, GQA, stacked "layers" axis
    ("mlm", "", {"tie_embeddings": False}),                           # BERT MLM head: transform, output bias
    ("mlm", "", {"num_classes": 3}),                                  # pooler + classifier
    ("seq2seq", "", {"scale_embeddings": False}),                     # cross-attention, two stacks
    ("seq2seq", "", {"scale_embeddings": False, "positional": "t5_relative"}),  # T5's bias tables
])
def test_every_parameter_is_classified_by_its_logical_names(family, preset, changes):
    module = {"lm": lm, "mlm": mlm, "seq2seq": seq2seq}[family]
    c = module.get_config(preset) if preset else module.get_config()
    c.model.update(dict(d_model=64, num_heads=4, d_ff=128, num_layers=2, vocab_size=128, max_len=32,
                        parametrization="mup", mup_base_width=16, **changes))
    c.data.seq_len = 32
    model = build_model(ModelConfig.from_dict(c.model))
    boxed = jax.eval_shape(lambda r: model.init(r, *get_task(c).init_inputs(c)), jax.random.PRNGKey(0))["params"]
    kinds = jax.tree_util.tree_flatten_with_path(mup.param_kinds(boxed))[0]
    got = {"/".join(str(k.key) for k in path): kind for path, kind in kinds}
    assert got == {path: _expected_kind(path) for path in got}
    assert {"input", "hidden", "vector"} <= set(got.values())


def test_a_logical_name_without_a_mup_rule_is_an_error():
    with pytest.raises(ValueError, match="relpos_buckets"):
        mup.param_kind(("relpos_buckets", "heads"), "blocks/relative_bias")


@pytest.mark.slow
def test_logits_are_the_standard_ones_times_base_over_width():
    """Same parameters, μP vs SP: the LM heads (tied, untied, and the chunked loss's `output_logits`) and the
    classifier's product (not its bias) are × base/width; nothing before them changes."""
    from transformer.models.decoder import output_logits

    tokens = np.arange(24, dtype=np.int32).reshape(2, 12) % 100 + 3
    for tied in (True, False):
        c = _lm_config(128, "sp", tie_embeddings=tied)
        sp, mu = (build_model(ModelConfig.from_dict(dict(c.model.to_dict(), parametrization=p))) for p in ("sp", "mup"))
        params = sp.init(jax.random.PRNGKey(1), tokens)["params"]
        expected = np.asarray(sp.apply({"params": params}, tokens)) * BASE / 128
        np.testing.assert_allclose(mu.apply({"params": params}, tokens), expected, rtol=1e-6, atol=1e-7)
        hidden = mu.apply({"params": params}, tokens, return_hidden=True)
        np.testing.assert_allclose(output_logits(mu.cfg, params, hidden), expected, rtol=1e-6, atol=1e-7)
    c = mlm.get_config()
    c.model.update(dict(d_model=64, num_heads=4, d_ff=128, num_layers=1, vocab_size=128, max_len=16, num_classes=3,
                        mup_base_width=16))
    sp, mu = (build_model(ModelConfig.from_dict(dict(c.model.to_dict(), parametrization=p))) for p in ("sp", "mup"))
    params = nn.unbox(sp.init(jax.random.PRNGKey(2), tokens)["params"])
    bias = np.array([0.5, -1.0, 2.0], np.float32)
    params["classifier"]["bias"] = bias
    sp_logits = np.asarray(sp.apply({"params": params}, tokens))
    np.testing.assert_allclose(mu.apply({"params": params}, tokens), (sp_logits - bias) / 4 + bias, rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("impl", ["einsum", "chunked"])
@pytest.mark.parametrize("attention_scale,expected", [(0.0, np.sqrt(4) / 16), (1.0, 4 / 16)])
def test_mup_attention_scores_scale_as_one_over_head_dim(impl, attention_scale, expected):
    """H = 16, H0 = 4: μP's scores are q·k × (the base scale) × H0/H: with SP's 1/sqrt(H0) that is q·k/8, not SP's
    q·k/4; with model.attention_scale=1 (T5) q·k/4. The implementations take it as their scale, so the chunked one
    computes the same attention as the einsum reference."""
    from transformer.layers.attention import MultiHeadAttention

    cfg = ModelConfig(d_model=64, num_heads=4, d_ff=128, vocab_size=128, parametrization="mup", mup_base_width=64,
                      mup_base_head_dim=4, positional="learned", attention_impl=impl, attention_scale=attention_scale)
    x_BTD = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 64))
    attention = MultiHeadAttention(cfg, causal=True)
    params = nn.unbox(attention.init(jax.random.PRNGKey(1), x_BTD)["params"])
    q = jnp.einsum("btd,dnh->btnh", x_BTD, params["query"]["kernel"]) + params["query"]["bias"]
    k = jnp.einsum("btd,dnh->btnh", x_BTD, params["key"]["kernel"]) + params["key"]["bias"]
    v = jnp.einsum("btd,dnh->btnh", x_BTD, params["value"]["kernel"]) + params["value"]["bias"]
    scores = jnp.einsum("btnh,bsnh->bnts", q, k) * expected
    weights = jax.nn.softmax(jnp.where(np.tril(np.ones((8, 8), bool)), scores, -jnp.inf), axis=-1)
    out = jnp.einsum("bnts,bsnh,nhd->btd", weights, v, params["out"]["kernel"]) + params["out"]["bias"]
    apply = jax.jit(attention.apply, static_argnames="return_weights")  # eager flax dispatches op by op: slower
    got_out, got_weights = apply({"params": params}, x_BTD, return_weights=True)
    np.testing.assert_allclose(got_weights, weights, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(apply({"params": params}, x_BTD), out, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_training_loop_applies_mup_init_and_adam_learning_rates(corpus_dir, tmp_path):
    """A LLaMA-shaped (untied) μP model at 4x its base width through experiments' training loop: hidden weights
    start at SP's std / 2 (variance ∝ 1/fan_in), the rest at SP's; Adam's first step moves every entry by
    lr × its multiplier (lr·g/|g|, with Adam's eps negligible), i.e. lr/4 for hidden weights and lr for the
    embedding, head and norms."""
    from transformer.training.loop import train
    from transformer.training.restore import load_run

    c = lm.get_config("llama_tiny")
    c.data.data_dir, c.data.seq_len = corpus_dir, 32
    c.model.update(dict(d_model=64, num_heads=4, num_kv_heads=2, d_ff=128, num_layers=2, parametrization="mup",
                        mup_base_width=16))
    lr = 1e-3
    c.train.update(dict(steps=1, batch_size=8, learning_rate=lr, schedule="constant", warmup_steps=0, eps=1e-20,
                        weight_decay=0.0, grad_clip=0.0, log_every=1, eval_every=1, eval_steps=1, checkpoint_every=1))
    workdir = str(tmp_path / "run")
    assert train(c, workdir, verbose=False)["status"] == "ok"
    run = load_run(workdir, step=1)
    mesh = sharding.make_mesh(c.mesh, jax.devices())
    state, _ = init_state(run.model, make_optimizer(c.train), c.train.seed, get_task(c).init_inputs(c), mesh,
                          sharding.rules(c.mesh))
    before, after = jax.device_get(state.params), jax.device_get(run.params)
    block = before["blocks"]["layers_0"]
    for kernel in (block["attention"]["query"]["kernel"], block["mlp"]["wi_gate"]["kernel"]):
        assert abs(np.std(kernel) / (0.02 / 2) - 1) < 0.05          # hidden: SP's 0.02 / sqrt(4)
    for table in (before["token_embedding"]["embedding"], before["head"]["kernel"]):
        assert abs(np.std(table) / 0.02 - 1) < 0.05                 # input, output: SP's 0.02

    def steps_of(path: str) -> np.ndarray:
        node_before, node_after = before, after
        for key in path.split("/"):
            node_before, node_after = node_before[key], node_after[key]
        delta = np.abs(np.asarray(node_after, np.float64) - np.asarray(node_before, np.float64)).ravel()
        return delta[delta > 0] / lr                                # unused embedding rows do not move

    expected = {"blocks/layers_0/attention/query/kernel": 0.25, "blocks/layers_1/attention/out/kernel": 0.25,
                "blocks/layers_0/mlp/wo/kernel": 0.25, "token_embedding/embedding": 1.0, "head/kernel": 1.0,
                "blocks/layers_1/mlp_norm/scale": 1.0, "final_norm/scale": 1.0}
    for path, multiplier in expected.items():
        relative = steps_of(path)
        assert np.median(relative) == pytest.approx(multiplier, rel=1e-3), path
        assert np.mean(np.abs(relative / multiplier - 1) < 0.01) > 0.9, path


@pytest.mark.parametrize("changes,match", [
    ({"parametrization": "mu"}, "model.parametrization='mu' is not valid; choose one of sp, mup"),
    ({"parametrization": "mup"}, "needs model.mup_base_width > 0"),
    ({"parametrization": "mup", "mup_base_width": -32}, "model.mup_base_width=-32 must be a non-negative integer"),
    ({"parametrization": "mup", "mup_base_width": 32, "mup_base_head_dim": 2.5}, "model.mup_base_head_dim=2.5"),
    ({"parametrization": "mup", "mup_base_width": 32, "scale_embeddings": True}, "scale_embeddings=True .* μP"),
    ({"parametrization": "mup", "mup_base_width": 32, "scale_tied_head": True, "family": "encoder_decoder"},
     "scale_tied_head=True .* μP"),
])
def test_bad_mup_settings_are_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**changes)


def test_sp_ignores_the_mup_settings_and_export_refuses_a_mup_model():
    assert ModelConfig(mup_base_width=32).parametrization == "sp"  # a config can switch between the two
    from transformer.interop.hf import converter_for
    assert converter_for(ModelConfig(vocab_size=128))[0] == "gpt2"
    with pytest.raises(ConfigError, match="μP"):
        converter_for(ModelConfig(vocab_size=128, parametrization="mup", mup_base_width=64))


def test_mup_transfer_sweep_designs_the_same_scan_under_both_parametrizations():
    from configs.sweeps import mup_transfer
    from transformer.design.plan import design

    scans = {}
    for parametrization in ("sp", "mup"):
        c = mup_transfer.get_config()
        c.base.model.parametrization = parametrization
        runs = design(c).runs
        scans[parametrization] = runs
        assert sorted({r.shape.d_model for r in runs}) == [32, 64, 128]          # 4x in width ...
        assert {r.shape.num_layers for r in runs} == {2} and len({r.tokens for r in runs}) == 1  # ... only
        assert {r.config["model"]["parametrization"] for r in runs} == {parametrization}
        assert {r.config["model"]["mup_base_width"] for r in runs} == {mup_transfer.BASE_WIDTH}
    assert [(r.shape, r.learning_rate) for r in scans["sp"]] == [(r.shape, r.learning_rate) for r in scans["mup"]]
    assert not {r.run_id for r in scans["sp"]} & {r.run_id for r in scans["mup"]}


def test_plot_lr_scans_draws_scans_side_by_side_and_prints_their_optima(tmp_path):
    import subprocess
    import sys

    from transformer.scaling import lr_scan

    rows = []
    for d_model, params, best in ((32, 30_000, 8e-3), (64, 100_000, 4e-3), (128, 400_000, 2e-3)):
        for lr in (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2):
            rows.append({"status": "ok", "d_model": d_model, "num_layers": 2, "params": params, "learning_rate": lr,
                         "eval_loss": 2.0 + 0.1 * np.log(lr / best) ** 2})
    for name in ("sp", "mup"):
        (tmp_path / name).mkdir()
        lr_scan.write_lr_fit(str(tmp_path / name), rows)
    out = tmp_path / "figures" / "transfer.png"
    done = subprocess.run([sys.executable, "-m", "experiments.plot_lr_scans", f"--scans={tmp_path / 'sp'},"
                           f"{tmp_path / 'mup'}", "--titles=SP,μP", f"--out={out}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 10_000
    assert "SP: lr_opt d32-L2 0.008, d64-L2 0.004, d128-L2 0.002; lr_opt = " in done.stdout
    missing = subprocess.run([sys.executable, "-m", "experiments.plot_lr_scans", f"--scans={tmp_path / 'none'}",
                              f"--out={out}"], capture_output=True, text=True)
    assert missing.returncode == 2 and "lr_fit.json does not exist" in missing.stderr
