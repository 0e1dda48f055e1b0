"""Hugging Face interop: random-weight GPT-2 / LLaMA / BERT built with `transformers`, imported, compared
logit for logit (also with padding masks), exported back and re-imported."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checks import hf_logits, perturbed  # noqa: E402
from transformer.interop.hf import from_pretrained, to_pretrained  # noqa: E402
from transformer.spec import ConfigError, ModelConfig  # noqa: E402
from transformer.models.decoder import DecoderLM  # noqa: E402

V = 101
TOL = 1e-4
SHAPES = {
    "gpt2_2l": ("GPT2LMHeadModel", dict(n_layer=2, n_embd=64, n_head=4, n_positions=64)),
    "gpt2_3l": ("GPT2LMHeadModel", dict(n_layer=3, n_embd=48, n_head=3, n_inner=80, n_positions=40,
                                        layer_norm_epsilon=1e-6)),
    "llama_gqa": ("LlamaForCausalLM", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                           num_key_value_heads=2, intermediate_size=96, rope_theta=500.0,
                                           rms_norm_eps=1e-5)),
    "llama_mha_tied_bias": ("LlamaForCausalLM", dict(num_hidden_layers=3, hidden_size=48, num_attention_heads=3,
                                                     num_key_value_heads=3, intermediate_size=64, head_dim=32,
                                                     tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    "bert_2l": ("BertForMaskedLM", dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                        intermediate_size=128, max_position_embeddings=64)),
    "bert_3l": ("BertForMaskedLM", dict(num_hidden_layers=3, hidden_size=48, num_attention_heads=2,
                                        intermediate_size=96, max_position_embeddings=40, hidden_act="gelu_new")),
}
CONFIGS = {"GPT2LMHeadModel": "GPT2Config", "LlamaForCausalLM": "LlamaConfig", "BertForMaskedLM": "BertConfig"}


def _hf_model(name: str):
    cls_name, kwargs = SHAPES[name]
    config = getattr(transformers, CONFIGS[cls_name])(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                                      **kwargs)
    return perturbed(getattr(transformers, cls_name), config)


@pytest.fixture(scope="module", params=list(SHAPES))
def imported(request, tmp_path_factory):
    """(name, HF model, our model, our params, checkpoint dir)."""
    hf = _hf_model(request.param)
    path = str(tmp_path_factory.mktemp(request.param))
    hf.save_pretrained(path)
    model, params = from_pretrained(path)
    return request.param, hf, model, params, path


def test_logits_match_transformers(imported):
    name, hf, model, params, _ = imported
    tokens_BT = np.random.RandomState(0).randint(3, V, (2, 17))
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(tokens_BT)))
    ref = hf_logits(hf, tokens_BT)
    assert ours.shape == ref.shape == (2, 17, V)
    assert np.abs(ref).max() > 0.5                      # the logits are not all ~0
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0)


def test_padded_batch_matches_attention_mask(imported):
    """Left padding for the decoders (with HF position_ids), right padding for BERT: our segment ids
    (0 = padding) and positions give HF's logits at every real token."""
    name, hf, model, params, _ = imported
    rs = np.random.RandomState(1)
    tokens_BT = rs.randint(3, V, (3, 12))
    lengths = [12, 7, 3]
    mask_BT = np.zeros((3, 12), np.int64)
    for b, n in enumerate(lengths):
        if name.startswith("bert"):
            mask_BT[b, :n] = 1
        else:
            mask_BT[b, 12 - n:] = 1
    tokens_BT = np.where(mask_BT == 1, tokens_BT, 0)
    positions_BT = np.clip(np.cumsum(mask_BT, axis=1) - 1, 0, None)
    hf_kwargs = dict(attention_mask=mask_BT)
    if not name.startswith("bert"):
        hf_kwargs["position_ids"] = positions_BT
    ref = hf_logits(hf, tokens_BT, **hf_kwargs)
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(tokens_BT), jnp.asarray(positions_BT),
                                  jnp.asarray(mask_BT.astype(np.int32))))
    real = mask_BT == 1
    np.testing.assert_allclose(ours[real], ref[real], atol=TOL, rtol=0)
    # the padding does matter: without the mask the short rows' logits change
    unmasked = np.asarray(model.apply({"params": params}, jnp.asarray(tokens_BT)))
    assert np.abs(unmasked[real] - ref[real]).max() > 1e-2


def test_export_reimports_exactly_and_loads_in_transformers(imported, tmp_path):
    name, hf, model, params, _ = imported
    out = to_pretrained(model, params, str(tmp_path / "export"))
    model2, params2 = from_pretrained(out)
    assert model2.cfg == model.cfg
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)
    auto = transformers.AutoModelForMaskedLM if name.startswith("bert") else transformers.AutoModelForCausalLM
    hf2 = auto.from_pretrained(out).eval()
    assert type(hf2) is type(hf)
    tokens_BT = np.random.RandomState(2).randint(3, V, (2, 9))
    np.testing.assert_allclose(hf_logits(hf2, tokens_BT), hf_logits(hf, tokens_BT), atol=TOL, rtol=0)


def test_pytorch_bin_checkpoint_and_scanned_export(tmp_path):
    """A pytorch_model.bin checkpoint imports like safetensors; a scan_layers model exports the same files
    as its unscanned twin."""
    hf = _hf_model("llama_gqa")
    _save_bin(hf, tmp_path / "bin")   # transformers 5.x save_pretrained writes safetensors only
    assert os.path.exists(tmp_path / "bin" / "pytorch_model.bin")
    model, params = from_pretrained(str(tmp_path / "bin"))
    tokens_BT = np.random.RandomState(3).randint(3, V, (1, 10))
    np.testing.assert_allclose(np.asarray(model.apply({"params": params}, jnp.asarray(tokens_BT))),
                               hf_logits(hf, tokens_BT), atol=TOL, rtol=0)
    scanned = DecoderLM(model.cfg.replace(scan_layers=True))
    stacked = dict(params, blocks={"layers": jax.tree.map(lambda *a: jnp.stack(a), *params["blocks"].values())})
    to_pretrained(scanned, stacked, str(tmp_path / "scanned"))
    _, params2 = from_pretrained(str(tmp_path / "scanned"))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)


def _save_bin(hf, path) -> None:
    os.makedirs(path, exist_ok=True)
    hf.config.save_pretrained(str(path))
    torch.save({k: v.contiguous() for k, v in hf.state_dict().items()}, os.path.join(path, "pytorch_model.bin"))


def test_unsupported_inputs_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bloom"}))
    with pytest.raises(ConfigError, match="model_type='bloom'.*gpt2, llama, bert, t5"):
        from_pretrained(str(tmp_path))
    hf = _hf_model("gpt2_2l")
    hf.config.scale_attn_by_inverse_layer_idx = True
    hf.save_pretrained(str(tmp_path / "scaled"))
    with pytest.raises(ConfigError, match="scale_attn_by_inverse_layer_idx"):
        from_pretrained(str(tmp_path / "scaled"))
    odd = ModelConfig(positional="sinusoidal")        # no HF family has sinusoidal positions here
    model = DecoderLM(odd)
    with pytest.raises(ConfigError, match="no Hugging Face counterpart"):
        to_pretrained(model, {}, str(tmp_path / "odd"))
