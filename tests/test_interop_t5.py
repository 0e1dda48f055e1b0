"""Hugging Face T5 interop: random-weight T5ForConditionalGeneration built with `transformers` (v1.0: ReLU, tied
head with the d_model^-0.5 rescale; v1.1: gated-GELU, its own lm_head; and the tied head without rescale that
transformers 5.x writes), imported, compared logit for logit (full and padded batches), generated from, exported
back and re-imported; this codebase's own T5-shaped models exported."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checks import perturbed  # noqa: E402
from transformer.spec import ConfigError, ModelConfig  # noqa: E402
from transformer.inference.generate import generate_seq2seq  # noqa: E402
from transformer.inference.sampling import SamplingConfig  # noqa: E402
from transformer.interop.hf import from_pretrained, to_pretrained  # noqa: E402
from transformer.models.encoder_decoder import EncoderDecoderModel  # noqa: E402

V = 101
TOL = 1e-4
SHAPES = {
    # name: (T5Config kwargs, own lm_head)
    "t5_v1_0": (dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, feed_forward_proj="relu",
                     relative_attention_num_buckets=8, relative_attention_max_distance=20), False),
    "t5_v1_1": (dict(d_model=48, d_kv=32, d_ff=80, num_layers=2, num_decoder_layers=3, num_heads=3,
                     feed_forward_proj="gated-gelu", tie_word_embeddings=False), True),
    "t5_tied_no_rescale": (dict(d_model=32, d_kv=8, d_ff=64, num_layers=3, num_decoder_layers=2, num_heads=4,
                                feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                relative_attention_num_buckets=16, relative_attention_max_distance=24), False),
}


def _hf_model(name: str):
    kwargs, own_head = SHAPES[name]
    config = transformers.T5Config(vocab_size=V, dropout_rate=0.0, **kwargs)
    model = perturbed(transformers.T5ForConditionalGeneration, config)
    with torch.no_grad():
        if own_head:  # transformers 5.x builds T5 with lm_head tied to the table; a v1.1 checkpoint has its own
            model.lm_head.weight = torch.nn.Parameter(torch.randn(V, kwargs["d_model"]) * 0.3)
    return model


def _save(hf, path: str, name: str) -> None:
    """Writes the checkpoint the way the hub holds it: v1.1 with tie_word_embeddings false and its own
    lm_head.weight (transformers 5.x's save_pretrained would drop a head it believes tied)."""
    if not SHAPES[name][1]:
        hf.save_pretrained(path)
        return
    from safetensors.torch import save_file
    hf.config.save_pretrained(path)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["tie_word_embeddings"] = False
    config.pop("scale_decoder_outputs", None)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    save_file({k: v.contiguous() for k, v in hf.state_dict().items() if "embed_tokens" not in k},
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module", params=list(SHAPES))
def imported(request, tmp_path_factory):
    """(name, HF model, our model, our params, checkpoint dir)."""
    hf = _hf_model(request.param)
    path = str(tmp_path_factory.mktemp(request.param))
    _save(hf, path, request.param)
    model, params = from_pretrained(path)
    return request.param, hf, model, params, path


def _hf_logits(hf, src_BS, tgt_BT, src_mask=None, tgt_mask=None) -> np.ndarray:
    kwargs = {} if src_mask is None else dict(attention_mask=torch.tensor(src_mask),
                                              decoder_attention_mask=torch.tensor(tgt_mask))
    with torch.no_grad():
        return hf(input_ids=torch.tensor(src_BS), decoder_input_ids=torch.tensor(tgt_BT), **kwargs).logits.numpy()


def _batch(seed: int, B: int, S: int, T: int):
    rs = np.random.RandomState(seed)
    src, tgt = rs.randint(2, V, (B, S)), rs.randint(2, V, (B, T))
    tgt[:, 0] = 0  # T5's decoder starts from the pad token
    return src, tgt


def test_config_follows_the_checkpoint(imported):
    name, hf, model, _, _ = imported
    cfg, c = model.cfg, hf.config
    assert (cfg.family, cfg.positional, cfg.attention_scale, cfg.norm) == ("encoder_decoder", "t5_relative", 1.0,
                                                                         "rmsnorm")
    assert (cfg.encoder_layers, cfg.num_layers, cfg.dim_per_head) == (c.num_layers, c.num_decoder_layers, c.d_kv)
    assert (cfg.relative_num_buckets, cfg.relative_max_distance) == (c.relative_attention_num_buckets,
                                                                     c.relative_attention_max_distance)
    expected = {"t5_v1_0": ("relu", True, True), "t5_v1_1": ("gelu_tanh_glu", False, False),
                "t5_tied_no_rescale": ("gelu_tanh_glu", True, False)}[name]
    assert (cfg.activation, cfg.tie_embeddings, cfg.scale_tied_head) == expected


@pytest.mark.slow
def test_logits_match_transformers(imported):
    name, hf, model, params, _ = imported
    src, tgt = _batch(0, 2, 29, 26)  # offsets past max_distance: the logarithmic buckets are used
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(src), jnp.asarray(tgt)))
    ref = _hf_logits(hf, src, tgt)
    assert ours.shape == ref.shape == (2, 26, V)
    assert np.abs(ref).max() > 0.5
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0)


@pytest.mark.slow
def test_padded_batch_matches_attention_masks(imported):
    """Sources right- and left-padded (T5's relative bias works on slots, as ours), targets right-padded: our
    segment ids (0 = padding) give HF's logits at every real target token; without them they differ."""
    name, hf, model, params, _ = imported
    src, tgt = _batch(1, 3, 15, 11)
    src_mask, tgt_mask = np.ones_like(src), np.ones_like(tgt)
    src_mask[1, 9:] = 0   # right-padded source
    src_mask[2, :6] = 0   # left-padded source
    tgt_mask[1, 7:] = 0
    tgt_mask[2, 4:] = 0
    src, tgt = src * src_mask, tgt * tgt_mask
    ref = _hf_logits(hf, src, tgt, src_mask, tgt_mask)
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(src), jnp.asarray(tgt), jnp.asarray(src_mask),
                                  jnp.asarray(tgt_mask)))
    real = tgt_mask == 1
    np.testing.assert_allclose(ours[real], ref[real], atol=TOL, rtol=0)
    unmasked = np.asarray(model.apply({"params": params}, jnp.asarray(src), jnp.asarray(tgt)))
    assert np.abs(unmasked[real] - ref[real]).max() > 1e-2


def test_cached_greedy_generation_equals_transformers(imported):
    """Our KV-cache decoding from the pad token (decoder_start_id=0) writes HF generate's greedy tokens. (HF
    decodes without its cache: in transformers 5.23 the cache has num_layers slots, fewer than a v1.1-shaped
    decoder with more layers than the encoder needs.)"""
    name, hf, model, params, _ = imported
    sources = [[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15]]
    N = 8
    ours = generate_seq2seq(model, params, sources, max_new_tokens=N, decoder_start_id=0,
                            sampling=SamplingConfig(temperature=0.0))
    src = np.zeros((2, 8), np.int64)
    mask = np.zeros((2, 8), np.int64)
    for b, s in enumerate(sources):
        src[b, :len(s)], mask[b, :len(s)] = s, 1
    with torch.no_grad():
        ref = hf.generate(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask), max_new_tokens=N,
                          min_new_tokens=N, do_sample=False, num_beams=1, decoder_start_token_id=0,
                          use_cache=False).numpy()
    np.testing.assert_array_equal(ours.tokens_BN, ref[:, 1:])   # HF's rows start with the start token


def test_export_reimports_exactly_and_loads_in_transformers(imported, tmp_path):
    name, hf, model, params, _ = imported
    out = to_pretrained(model, params, str(tmp_path / "export"))
    model2, params2 = from_pretrained(out)
    assert model2.cfg == model.cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)
    hf2 = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    assert type(hf2) is type(hf)
    src, tgt = _batch(2, 2, 12, 9)
    np.testing.assert_allclose(_hf_logits(hf2, src, tgt), _hf_logits(hf, src, tgt), atol=TOL, rtol=0)


@pytest.mark.parametrize("activation,tied,scan", [("geglu", False, False), ("relu", True, True),
                                                  ("swiglu", True, False)])
@pytest.mark.slow
def test_own_t5_shaped_models_export(activation, tied, scan, tmp_path):
    """A model of this codebase (q·k scaled by 1/sqrt(H), which export folds into the query kernels; exact
    GeGLU as "gated-gelu_python"; scanned layers) gives the same logits in transformers."""
    cfg = ModelConfig(family="encoder_decoder", vocab_size=V, d_model=32, num_layers=2, num_encoder_layers=3,
                      num_heads=4, d_ff=48, positional="t5_relative", relative_num_buckets=16,
                      relative_max_distance=20, norm="rmsnorm", activation=activation, use_bias=False,
                      tie_embeddings=tied, scale_tied_head=tied and activation == "relu", scan_layers=scan)
    model = EncoderDecoderModel(cfg)
    src, tgt = _batch(3, 2, 25, 22)
    params = model.init(jax.random.PRNGKey(0), jnp.asarray(src[:, :4]), jnp.asarray(tgt[:, :4]))["params"]
    params = jax.tree.map(lambda p: p * 8.0 if p.ndim > 1 else p + 0.1, params)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(to_pretrained(model, params, str(tmp_path))).eval()
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(src), jnp.asarray(tgt)))
    assert np.abs(ours).max() > 0.5
    np.testing.assert_allclose(_hf_logits(hf, src, tgt), ours, atol=TOL, rtol=0)


def test_unsupported_inputs_are_named(tmp_path):
    hf = _hf_model("t5_v1_0")
    hf.config.feed_forward_proj = "gated-relu"
    hf.save_pretrained(str(tmp_path / "reglu"))
    with pytest.raises(ConfigError, match="feed_forward_proj='gated-relu' is not supported"):
        from_pretrained(str(tmp_path / "reglu"))
    biased = ModelConfig(family="encoder_decoder", positional="t5_relative", use_bias=True)
    with pytest.raises(ConfigError, match="no Hugging Face counterpart"):
        to_pretrained(EncoderDecoderModel(biased), {}, str(tmp_path / "biased"))
