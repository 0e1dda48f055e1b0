"""LoRA against Hugging Face `peft`: our adapters written in peft's format and loaded with
`peft.PeftModel.from_pretrained` over the base give our logits (1e-4); adapters peft made itself read back into
ours give peft's logits; merged adapters give the unmerged model's logits (1e-5). Tiny local GPT-2, LLaMA and
BERT checkpoints, built here."""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from hf_checks import perturbed  # noqa: E402
from transformer.interop.hf import from_pretrained  # noqa: E402
from transformer.interop.peft import from_peft, to_peft  # noqa: E402
from transformer.layers import lora  # noqa: E402
from transformer.models import build_model  # noqa: E402
from transformer.spec import LoraSpec  # noqa: E402

V = 96
SHAPES = {
    "gpt2": (transformers.GPT2LMHeadModel, lambda: transformers.GPT2Config(
        vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=32)),
    "llama": (transformers.LlamaForCausalLM, lambda: transformers.LlamaConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, max_position_embeddings=32)),
    "bert": (transformers.BertForMaskedLM, lambda: transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=32)),
}
# GPT-2: two of c_attn's three parts (a block-diagonal rank-8 c_attn adapter), plus out and the MLP
TARGETS = {"gpt2": "query,value,out,mlp_in,mlp_out", "llama": "query,key,value,out,mlp_in,mlp_out",
           "bert": "query,key,value,out,mlp_in,mlp_out"}
TOKENS = np.random.default_rng(0).integers(3, V, (2, 9)).astype(np.int64)


def _hf_base(name: str, tmp_path) -> str:
    cls, config = SHAPES[name]
    path = str(tmp_path / f"{name}-base")
    perturbed(cls, config()).save_pretrained(path)
    return path


def _load(name: str, path: str) -> torch.nn.Module:
    return SHAPES[name][0].from_pretrained(path).eval()


def _logits(module: torch.nn.Module) -> np.ndarray:
    with torch.no_grad():
        return module(input_ids=torch.tensor(TOKENS)).logits.numpy()


def _random_adapters(fresh, params, seed: int):
    """`fresh` (an adapted model's initial parameters) with the base weights of `params` and every lora_a / lora_b
    drawn at random (a fresh B is zero: it would test nothing)."""
    rng = np.random.default_rng(seed)

    def fill(path, x):
        names = [k.key for k in path]
        if names[-1] in ("lora_a", "lora_b"):
            return jnp.asarray(rng.normal(0, 0.2, x.shape), jnp.float32)
        node = params
        for k in names:
            node = node[k]
        return node
    return jax.tree_util.tree_map_with_path(fill, fresh)


def _adapted(model, params, spec: LoraSpec, seed: int = 0):
    """The base model with adapters of `spec`, A and B random (a fresh B is zero: it would test nothing)."""
    cfg = model.cfg.replace(lora=spec)
    fresh = nn.unbox(build_model(cfg).init(jax.random.PRNGKey(seed), jnp.zeros((1, 4), jnp.int32))["params"])
    return cfg, _random_adapters(fresh, params, seed)


def _ours(cfg, params) -> np.ndarray:
    return np.asarray(build_model(cfg).apply({"params": params}, jnp.asarray(TOKENS, jnp.int32)))


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n == "gpt2" else []) for n in SHAPES])  # CI's 15 minutes (2026-11-27): gpt2 41 s
def test_peft_loads_our_adapters_with_our_logits(name, tmp_path):
    base = _hf_base(name, tmp_path)
    model, params = from_pretrained(base)
    cfg, adapted = _adapted(model, params, LoraSpec(rank=4, alpha=8.0, targets=TARGETS[name]))
    ours = _ours(cfg, adapted)
    assert np.abs(ours - _ours(model.cfg, params)).max() > 1e-2  # the adapters change the function

    config = to_peft(cfg, adapted, str(tmp_path / "adapter"), base_model=base)
    assert sorted(os.listdir(tmp_path / "adapter")) == ["adapter_config.json", "adapter_model.safetensors"]
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    theirs = _logits(peft.PeftModel.from_pretrained(_load(name, base), str(tmp_path / "adapter")).eval())
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)

    # ... and read back: the same adapters (GPT-2's c_attn split into its parts again), the same logits
    back_cfg, back = from_peft(str(tmp_path / "adapter"), model.cfg, params)
    assert back_cfg.lora == cfg.lora
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(adapted), jax.tree.leaves(back)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-7, err_msg=jax.tree_util.keystr(path))

    # merged: the plain model with W + s·A·B computes the adapted model's logits
    merged_cfg, merged = lora.merge(cfg, adapted)
    assert merged_cfg.lora == LoraSpec() and "lora_a" not in json.dumps(jax.tree_util.tree_map(lambda _: 0, merged))
    np.testing.assert_allclose(_ours(merged_cfg, merged), ours, atol=1e-5, rtol=0)


PEFT_TARGETS = {"gpt2": ["c_attn", "mlp.c_proj"], "llama": ["q_proj", "v_proj", "down_proj", "gate_proj"],
                "bert": ["query", "attention.output.dense", "intermediate.dense"]}


@pytest.mark.parametrize("name", list(SHAPES))
def test_we_read_adapters_peft_made(name, tmp_path):
    base = _hf_base(name, tmp_path)
    torch.manual_seed(1)
    config = peft.LoraConfig(r=3, lora_alpha=5, target_modules=PEFT_TARGETS[name], fan_in_fan_out=name == "gpt2",
                             rank_pattern={PEFT_TARGETS[name][-1]: 2}, alpha_pattern={PEFT_TARGETS[name][0]: 7})
    tuned = peft.get_peft_model(_load(name, base), config).eval()
    with torch.no_grad():  # peft's fresh lora_B is zero: give every adapter a value
        for key, p in tuned.named_parameters():
            if "lora_" in key:
                p.copy_(torch.randn_like(p) * 0.2)
    theirs = _logits(tuned)
    tuned.save_pretrained(str(tmp_path / "made-by-peft"))

    model, params = from_pretrained(base)
    cfg, adapted = from_peft(str(tmp_path / "made-by-peft"), model.cfg, params)
    assert cfg.lora.rank == 3 and cfg.lora.dropout == 0.0
    assert np.abs(theirs - _ours(model.cfg, params)).max() > 1e-2
    np.testing.assert_allclose(_ours(cfg, adapted), theirs, atol=1e-4, rtol=0)


def test_unsupported_peft_options_are_named(tmp_path):
    from transformer.spec import ConfigError
    base = _hf_base("llama", tmp_path)
    tuned = peft.get_peft_model(_load("llama", base), peft.LoraConfig(r=2, target_modules=["q_proj"], bias="all"))
    tuned.save_pretrained(str(tmp_path / "biased"))
    model, params = from_pretrained(base)
    with pytest.raises(ConfigError, match="bias='all' is not supported"):
        from_peft(str(tmp_path / "biased"), model.cfg, params)
    with pytest.raises(ConfigError, match="no LoRA adapters"):
        to_peft(model.cfg, params, str(tmp_path / "none"))


@pytest.mark.slow  # CI's 15 minutes: 18 s of the default run on 2 loaded cores (2026-11-27)
def test_t5_adapters_follow_the_query_scale_export_folds(tmp_path):
    """Our T5-shaped models keep 1/sqrt(H) in q·k, which export folds into the query kernels: their query adapters
    are folded the same way, so peft over the exported base gives our logits (self- and cross-attention)."""
    from transformer.interop.hf import to_pretrained
    config = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                   feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0)
    perturbed(transformers.T5ForConditionalGeneration, config).save_pretrained(str(tmp_path / "t5"))
    model, params = from_pretrained(str(tmp_path / "t5"))
    ours_cfg = model.cfg.replace(attention_scale=0.0)  # this codebase's T5 shape: 1/sqrt(H) kept in q·k
    to_pretrained(build_model(ours_cfg), params, str(tmp_path / "base"))
    base_model = build_model(ours_cfg)
    cfg = ours_cfg.replace(lora=LoraSpec(rank=2, alpha=4.0, targets="query,value,out,mlp_in"))
    fresh = nn.unbox(build_model(cfg).init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32),
                                           jnp.zeros((1, 4), jnp.int32))["params"])
    adapted = _random_adapters(fresh, params, 0)
    src, tgt = jnp.asarray(TOKENS, jnp.int32), jnp.asarray(TOKENS[:, ::-1].copy(), jnp.int32)
    ours = np.asarray(build_model(cfg).apply({"params": adapted}, src, tgt))
    assert np.abs(ours - np.asarray(base_model.apply({"params": params}, src, tgt))).max() > 1e-2
    to_peft(cfg, adapted, str(tmp_path / "adapter"))
    hf = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "base")).eval()
    tuned = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        theirs = tuned(input_ids=torch.tensor(TOKENS), decoder_input_ids=torch.tensor(TOKENS[:, ::-1].copy())).logits
    np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-4, rtol=0)
    back_cfg, back = from_peft(str(tmp_path / "adapter"), ours_cfg, params)
    assert back_cfg.lora == cfg.lora
    np.testing.assert_allclose(np.asarray(build_model(back_cfg).apply({"params": back}, src, tgt)), ours, atol=1e-4,
                               rtol=0)
