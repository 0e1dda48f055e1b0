"""Generation: sampling filters, cached decoding == full forward (ragged batches), stop tokens, the CLI."""
import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cheap_init import init_variables
from transformer.inference.generate import _generate_decoder, generate, generate_seq2seq, left_pad
from transformer.inference.sampling import SamplingConfig, sample_tokens, top_k_filter, top_p_filter
from transformer.spec import ConfigError, ModelConfig
from transformer.models.decoder import DecoderLM
from transformer.models.encoder_decoder import EncoderDecoderModel
from xla_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT2 = dict(positional="learned", norm="layernorm", activation="gelu_tanh", tie_embeddings=True, use_bias=True)
LLAMA = dict(positional="rope", norm="rmsnorm", activation="swiglu", tie_embeddings=False, use_bias=False,
             num_kv_heads=2, norm_eps=1e-6)
PROMPTS = [[1, 40, 41, 42, 43, 44, 45], [1, 50], [1, 60, 61, 62]]


@functools.lru_cache(maxsize=None)
def _model(shape: str, scan: bool = False):
    cfg = ModelConfig(vocab_size=97, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_len=64, scan_layers=scan,
                      **(GPT2 if shape == "gpt2" else LLAMA))
    model = DecoderLM(cfg)
    params = init_variables(model, jnp.zeros((1, 8), jnp.int32), seed=1)["params"]
    # Larger weights than the 0.02 init make the logits (and so the argmax) depend on the context.
    params = jax.tree.map(lambda p: p * 8.0 if p.ndim > 1 else p, params)
    return model, params


# ---------------------------------------------------------------- sampling functions

def test_top_k_keeps_exactly_the_k_largest():
    logits_BV = jnp.asarray([[0.1, 3.0, -1.0, 2.0, 0.5], [5.0, 4.0, 3.0, 2.0, 1.0]])
    out = np.asarray(top_k_filter(logits_BV, 2))
    assert np.isfinite(out).tolist() == [[False, True, False, True, False], [True, True, False, False, False]]
    np.testing.assert_array_equal(np.asarray(top_k_filter(logits_BV, 0)), np.asarray(logits_BV))


def test_top_p_keeps_the_nucleus():
    probs = np.array([[0.5, 0.3, 0.15, 0.05]])
    logits_BV = jnp.log(jnp.asarray(probs))
    kept = lambda p: np.isfinite(np.asarray(top_p_filter(logits_BV, p)))[0].tolist()  # noqa: E731
    assert kept(0.5) == [True, False, False, False]     # mass before token 2 is 0.5: not < 0.5
    assert kept(0.6) == [True, True, False, False]
    assert kept(0.9) == [True, True, True, False]
    assert kept(0.01) == [True, False, False, False]    # the most likely token always stays
    assert kept(1.0) == [True, True, True, True]


def test_sampling_frequencies_follow_the_filtered_softmax():
    logits_V = jnp.asarray([2.0, 1.0, 0.0, -1.0])
    n = 20000
    rngs = jax.random.split(jax.random.PRNGKey(0), n)
    draw = jax.jit(jax.vmap(lambda r, t, k, p: sample_tokens(r, logits_V[None], t, k, p)[0],
                            in_axes=(0, None, None, None)))
    for temperature, top_k, top_p, expected in [
            (1.0, 0, 1.0, jax.nn.softmax(logits_V)),
            (2.0, 0, 1.0, jax.nn.softmax(logits_V / 2.0)),
            (1.0, 2, 1.0, jax.nn.softmax(jnp.asarray([2.0, 1.0]))),
            (1.0, 0, 0.8, jax.nn.softmax(jnp.asarray([2.0, 1.0])))]:   # p(0)=.64 < .8, p(0)+p(1)=.88
        counts = np.bincount(np.asarray(draw(rngs, temperature, top_k, top_p)), minlength=4) / n
        expected = np.pad(np.asarray(expected), (0, 4 - len(expected)))
        np.testing.assert_allclose(counts, expected, atol=0.015)


def test_temperature_zero_is_greedy_and_bad_settings_are_rejected():
    logits_BV = jax.random.normal(jax.random.PRNGKey(3), (16, 50))
    tokens = sample_tokens(jax.random.PRNGKey(0), logits_BV, 0.0, 5, 0.5)
    np.testing.assert_array_equal(np.asarray(tokens), np.argmax(np.asarray(logits_BV), -1))
    for bad in (dict(temperature=-1.0), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            SamplingConfig(**bad)


# ---------------------------------------------------------------- cached decoding

def test_left_pad_layout():
    tokens, segments, positions = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert tokens.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert segments.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert positions.tolist() == [[0, 1, 2], [0, 0, 0]]
    with pytest.raises(ValueError, match="empty"):
        left_pad([[1], []])


@pytest.mark.parametrize("shape,scan", [("gpt2", False), ("llama", False), ("llama", True)])
def test_cached_generation_logits_equal_full_forward(shape, scan):
    """Every generated token's logits (ragged, left-padded batch, cache) equal a full forward pass over
    that row alone, unpadded."""
    model, params = _model(shape, scan)
    N = 6
    out = generate(model, params, PROMPTS, max_new_tokens=N, sampling=SamplingConfig(temperature=0.0),
                   return_logits=True)
    assert out.tokens_BN.shape == (3, N) and out.lengths_B.tolist() == [N] * 3
    full = jax.jit(lambda tokens_BT: model.apply({"params": params}, tokens_BT))
    for b, prompt in enumerate(PROMPTS):
        seq = prompt + out.tokens_BN[b].tolist()
        # padding on the right changes no earlier position of a causal model: one shape, one compilation
        full_TV = np.asarray(full(np.asarray([seq + [0] * (16 - len(seq))], np.int32)))[0]
        P = len(prompt)
        # 2e-5: the full pass (chunked attention) and the cached steps sum in different orders
        np.testing.assert_allclose(out.logits_BNV[b], full_TV[P - 1:P - 1 + N], atol=2e-5, rtol=0)
        np.testing.assert_array_equal(out.tokens_BN[b], np.argmax(full_TV[P - 1:P - 1 + N], -1))
    # the greedy continuations are not all the same token (the comparison above is not trivial)
    assert len(set(out.tokens_BN.ravel().tolist())) > 3


@pytest.mark.slow  # CI's 15 minutes: 21 s of the default run on 2 loaded cores (2026-11-27)
def test_sampled_rows_do_not_depend_on_their_batch_neighbours():
    """Every step of every row of a sampled ragged batch is what the model gives that row alone: the logits each
    token was drawn from equal a full forward pass over the row's own prompt + sampled tokens, batch of one."""
    model, params = _model("llama")
    N = 6
    out = generate(model, params, PROMPTS, max_new_tokens=N, rng=jax.random.PRNGKey(7),
                   sampling=SamplingConfig(temperature=1.0, top_k=20), return_logits=True)
    assert (out.lengths_B == N).all()
    for b, prompt in enumerate(PROMPTS):
        sampled_N = out.tokens_BN[b].tolist()
        alone_TV = np.asarray(model.apply({"params": params}, jnp.asarray([prompt + sampled_N[:-1]]))[0])
        np.testing.assert_allclose(out.logits_BNV[b], alone_TV[len(prompt) - 1:], atol=1e-4, rtol=0)
        # and each token was drawn from those logits' top 20
        ranks_N = (alone_TV[len(prompt) - 1:] > alone_TV[len(prompt) - 1:][np.arange(N), sampled_N][:, None]).sum(-1)
        assert (ranks_N < 20).all(), ranks_N


def test_stop_tokens_end_rows_and_pad_after():
    model, params = _model("gpt2")
    greedy = SamplingConfig(temperature=0.0)
    free = generate(model, params, PROMPTS, max_new_tokens=8, sampling=greedy)
    stop = int(free.tokens_BN[0, 2])              # row 0 stops at its third token (or earlier)
    first = lambda row: next((i for i, t in enumerate(row) if t == stop), None)  # noqa: E731
    out = generate(model, params, PROMPTS, max_new_tokens=8, sampling=greedy, stop_tokens=[stop], pad_id=0)
    for b in range(3):
        k = first(free.tokens_BN[b].tolist())
        n = 8 if k is None else k + 1
        assert out.lengths_B[b] == n
        np.testing.assert_array_equal(out.tokens_BN[b, :n], free.tokens_BN[b, :n])
        assert (out.tokens_BN[b, n:] == 0).all()
    assert out.sequences()[0][-1] == stop


def test_one_compilation_serves_all_sampling_settings():
    model, params = _model("gpt2")
    generate(model, params, PROMPTS, max_new_tokens=4, rng=jax.random.PRNGKey(0))
    size = _generate_decoder._cache_size()
    for s in (SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)):
        generate(model, params, PROMPTS, max_new_tokens=4, rng=jax.random.PRNGKey(1), sampling=s)
    assert _generate_decoder._cache_size() == size


def test_generation_length_is_checked_against_the_position_table():
    model, params = _model("gpt2")
    with pytest.raises(ConfigError, match="max_len=64"):
        generate(model, params, PROMPTS, max_new_tokens=60, sampling=SamplingConfig(temperature=0.0))
    with pytest.raises(ValueError, match="rng"):
        generate(model, params, PROMPTS, max_new_tokens=4)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["vaswani", "t5"])
def test_seq2seq_cached_generation_equals_full_forward(shape):
    """Encoder–decoder: ragged (right-padded) sources, ragged (left-padded) target prefixes; every generated
    token's logits equal the teacher-forced forward pass over that example alone."""
    shapes = {"vaswani": dict(positional="sinusoidal", norm="layernorm", norm_position="post", activation="relu"),
              "t5": dict(positional="rope", norm="rmsnorm", norm_position="pre", activation="geglu",
                         tie_embeddings=False, use_bias=False, num_kv_heads=2)}
    cfg = ModelConfig(family="encoder_decoder", vocab_size=97, d_model=32, num_layers=2, num_encoder_layers=2,
                      num_heads=4, d_ff=64, max_len=64, **shapes[shape])
    model = EncoderDecoderModel(cfg)
    params = model.init(jax.random.PRNGKey(2), jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 8), jnp.int32))["params"]
    params = jax.tree.map(lambda p: p * 8.0 if p.ndim > 1 else p, params)
    sources = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    targets = [[1], [1, 30, 31], [1, 40]]
    N = 5
    out = generate_seq2seq(model, params, sources, targets=targets, max_new_tokens=N,
                           sampling=SamplingConfig(temperature=0.0), return_logits=True)
    full = jax.jit(lambda src, tgt: model.apply({"params": params}, src, tgt))
    for b in range(3):
        tgt = targets[b] + out.tokens_BN[b].tolist()
        full_TV = np.asarray(full(np.asarray([sources[b]], np.int32), np.asarray([tgt], np.int32)))[0]
        P = len(targets[b])
        # 2e-5: the full pass (chunked attention) and the cached steps sum in different orders
        np.testing.assert_allclose(out.logits_BNV[b], full_TV[P - 1:P - 1 + N], atol=2e-5, rtol=0)
    # the source matters: another source gives other logits for the same target prefix
    other = generate_seq2seq(model, params, [[20, 21, 22]] + sources[1:], targets=targets, max_new_tokens=1,
                             sampling=SamplingConfig(temperature=0.0), return_logits=True)
    assert np.abs(other.logits_BNV[0, 0] - out.logits_BNV[0, 0]).max() > 1e-2
    np.testing.assert_allclose(other.logits_BNV[1:, 0], out.logits_BNV[1:, 0], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- experiments.sample

def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, XLA_FLAGS=xla_flags(1))
    return subprocess.run([sys.executable, "-m", "experiments.sample", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_sample_cli_prints_continuations_from_params_only(tiny_lm_run):
    from transformer.training.restore import load_run

    run = load_run(tiny_lm_run)
    assert run.step == 4 and set(run.params) >= {"token_embedding", "blocks"}
    proc = _cli(f"--workdir={tiny_lm_run}", "--prompt=def ", "--max_new_tokens=12", "--num_samples=2", "--seed=3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("--- sample ") == 2 and "(step 4, " in proc.stdout
    assert proc.stdout.splitlines()[1].startswith("def ")


def test_sample_cli_missing_run_is_one_line_error(tmp_path):
    proc = _cli(f"--workdir={tmp_path / 'nothing'}", "--prompt=x")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "does not exist" in proc.stderr
    (tmp_path / "config.json").write_text("{}")
    proc = _cli(f"--workdir={tmp_path}", "--prompt=x")
    assert proc.returncode == 2 and "no checkpoint" in proc.stderr and "Traceback" not in proc.stderr
