"""Hugging Face export writes every parameter of the model or refuses, naming them.

Each model option (tests/test_accounting_drift.OPTIONS), turned on over each exportable shape (GPT-2, LLaMA,
Qwen3, GPT-NeoX, BERT, T5): either to_pretrained refuses with a ConfigError and writes nothing, or `transformers`
loads what it wrote and gives our logits (1e-4) and importing it back gives exactly our parameters. A dropped
parameter or an option the layout does not have cannot pass: the first shows in the parameters, both in the
logits. The new options run in the default suite; every option × shape is `slow`."""
from __future__ import annotations

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from test_accounting_drift import OPTIONS
from transformer.models import build_model
from transformer.spec import ConfigError, ModelConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformer.interop import hf, hf_gpt2  # noqa: E402
from transformer.interop import tensors as t  # noqa: E402
from transformer.interop.export import HF_CLASSES  # noqa: E402
from transformer.layers import head_pruning  # noqa: E402

SMALL = dict(vocab_size=61, d_model=16, num_layers=2, num_heads=4, d_ff=24, max_len=16)
SHAPES = {
    "gpt2": dict(),
    "llama": dict(positional="rope", norm="rmsnorm", activation="swiglu", num_kv_heads=2, tie_embeddings=False,
                  use_bias=False),
    "qwen3": dict(positional="rope", norm="rmsnorm", activation="swiglu", num_kv_heads=2, tie_embeddings=False,
                  use_bias=False, qk_norm=True),
    "gpt_neox": dict(positional="rope", parallel_block=True, tie_embeddings=False),
    "bert": dict(family="encoder", norm_position="post", embedding_norm=True),
    "t5": dict(family="encoder_decoder", positional="t5_relative", norm="rmsnorm", use_bias=False, activation="relu",
               relative_num_buckets=8, relative_max_distance=16),
}
NEW_OPTIONS = ("qk_norm", "parallel_block", "lora", "pruned_heads")


def _cases(options) -> dict[str, ModelConfig]:
    """{"shape-option=value": config}: each option's values other than the shape's own, where valid."""
    cases = {}
    for shape, settings in SHAPES.items():
        base = ModelConfig(**SMALL, **settings)
        cases[shape] = base
        for name in options:
            for value in OPTIONS[name]:
                if getattr(base, name) != value:
                    try:
                        cases[f"{shape}-{name}={value}"] = base.replace(**{name: value})
                    except ConfigError:
                        pass
    return cases


def _inputs(cfg: ModelConfig) -> tuple[np.ndarray, ...]:
    tokens = np.random.RandomState(1).randint(3, cfg.vocab_size, (2, 7))
    return (tokens, tokens[:, ::-1].copy()) if cfg.family == "encoder_decoder" else (tokens,)


def _hf_logits(model, cfg: ModelConfig, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
    with torch.no_grad():
        if cfg.family == "encoder_decoder":
            return model(input_ids=torch.tensor(inputs[0]), decoder_input_ids=torch.tensor(inputs[1])).logits.numpy()
        return model(torch.tensor(inputs[0])).logits.numpy()


def _export_or_refuse(cfg: ModelConfig, path: str) -> str:
    """'refused' (a ConfigError, nothing written) or the Hugging Face family it was written as, after checking
    that transformers reproduces our logits and that re-import gives our parameters exactly."""
    model = build_model(cfg.replace(attention_impl="einsum"))
    inputs = _inputs(cfg)
    params = model.init(jax.random.PRNGKey(0), *map(jnp.asarray, inputs))["params"]
    rng = np.random.RandomState(0)
    params = jax.tree.map(lambda p: np.asarray(p) + rng.normal(0, 0.1, np.shape(p)).astype(np.float32),
                          jax.tree.map(np.asarray, nn.unbox(params)))
    try:
        hf.to_pretrained(model, params, path)
    except ConfigError:
        assert not os.path.exists(path), "a refused export wrote files"
        return "refused"
    name = t.read_config(path)["model_type"]
    auto = getattr(transformers, HF_CLASSES[name]).from_pretrained(path).eval()
    ours = np.asarray(model.apply({"params": params}, *map(jnp.asarray, inputs)))
    np.testing.assert_allclose(_hf_logits(auto, cfg, inputs), ours, atol=1e-4, rtol=0, err_msg=str(cfg))
    model2, params2 = hf.from_pretrained(path)   # scanned layers come back unscanned (blocks/layers_i)
    if cfg.pruned_heads:  # written with the removed heads as zero rows: they come back as such, unpruned
        _, params = head_pruning.zero_padded(cfg, t.unstack_layers(params))
    if name == "t5" and model.cfg.attention_scale != 1.0:
        # T5 folds our 1/sqrt(H) into its query kernel: the re-import is the same model with attention_scale=1
        np.testing.assert_allclose(np.asarray(model2.apply({"params": params2}, *map(jnp.asarray, inputs))), ours,
                                   atol=1e-5, rtol=0)
        return name
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), t.unstack_layers(params),
                 params2)
    return name


NEW_CASES = _cases(NEW_OPTIONS)
EXPECTED = {"qwen3": "qwen3", "gpt_neox": "gpt_neox", "llama-qk_norm=True": "qwen3", "qwen3-qk_norm=False": "llama",
            "gpt2-qk_norm=True": "refused", "gpt2-parallel_block=True": "refused", "bert-qk_norm=True": "refused",
            "t5-qk_norm=True": "refused", "gpt_neox-qk_norm=True": "refused", "llama-parallel_block=True": "refused"}
# LoRA adapters are no plain checkpoint's (export --merge_lora or --peft); pruned heads export as zero rows
EXPECTED.update({k: "refused" for k in NEW_CASES if "-lora=" in k})
EXPECTED.update({k: k.split("-")[0] for k in NEW_CASES if "-pruned_heads=" in k})


@pytest.mark.parametrize("case", [k for k in NEW_CASES if k in EXPECTED])
def test_new_options_export_exactly_or_are_refused(case, tmp_path):
    assert _export_or_refuse(NEW_CASES[case], str(tmp_path / "out")) == EXPECTED[case]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(_cases(OPTIONS)))
def test_every_option_exports_exactly_or_is_refused(case, tmp_path):
    _export_or_refuse(_cases(OPTIONS)[case], str(tmp_path / "out"))


def test_a_parameter_the_converter_does_not_read_is_named(tmp_path):
    """The issue's case: a GPT-2-shaped model with QK-norm matches GPT-2's layout test (which knows nothing of
    QK-norm); the export used to drop the norms silently. Now the unread parameters are named."""
    cfg = ModelConfig(**SMALL, qk_norm=True)
    with pytest.raises(ConfigError, match=r"gpt2 needs model.qk_norm=False \(got True\)"):
        hf.converter_for(cfg)  # the layout check names it now; the parameter check below is the backstop
    model = build_model(cfg)
    params = jax.tree.map(np.asarray, nn.unbox(
        model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]))
    with pytest.raises(ConfigError, match=r"gpt2: its parameter\(s\) blocks/layers_0/attention/key_norm/scale, "
                                          r"blocks/layers_0/attention/query_norm/scale, blocks/layers_1/"):
        hf.hf_tensors("gpt2", hf_gpt2, t.unstack_layers(params), cfg)
    # a parallel block has no attention_norm: GPT-2's layout needs one
    par_cfg = cfg.replace(qk_norm=False, parallel_block=True)
    par = build_model(par_cfg)
    params = jax.tree.map(np.asarray, nn.unbox(
        par.init(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]))
    with pytest.raises(ConfigError, match="needs parameter blocks/layers_0/attention_norm"):
        hf.hf_tensors("gpt2", hf_gpt2, t.unstack_layers(params), par_cfg)
    with pytest.raises(ConfigError, match="gpt2 needs model.parallel_block=False"):
        hf.to_pretrained(par, params, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


@dataclasses.dataclass(frozen=True)
class _WithResidualScale(ModelConfig):
    """docs/extending.md's example of a new option that adds no parameter: the layers would scale each residual
    branch; no Hugging Face mapping knows it."""

    residual_scale: float = 1.0


@pytest.mark.parametrize("shape", list(SHAPES))
def test_an_option_no_mapping_reads_is_refused_when_on(shape):
    """The issue's case: an option without parameters (classified NO_PARAMETERS) exported as plain LLaMA with
    other logits. Any setting away from its default that the mapping does not read is refused, naming it."""
    base = _WithResidualScale(**SMALL, **SHAPES[shape])
    model = build_model(base)
    shapes = nn.unbox(jax.eval_shape(lambda r: model.init(r, *map(jnp.asarray, _inputs(base))),
                                     jax.random.PRNGKey(0))["params"])
    params = t.unstack_layers(jax.tree.map(lambda a: np.zeros(a.shape, np.float32), shapes))
    name, converter = hf.converter_for(base)
    assert name == shape
    hf.hf_tensors(name, converter, params, base)  # at its default the option changes nothing: exported
    with pytest.raises(ConfigError, match=r"^model.residual_scale=0.5 \(default 1.0\): Hugging Face "):
        hf.hf_tensors(name, converter, params, base.replace(residual_scale=0.5))


@pytest.mark.parametrize("setting", ["attention_scale", "rope_base", "norm_eps", "scale_tied_head"])
def test_settings_without_parameters_export_exactly_or_are_refused(setting, tmp_path):
    """NO_PARAMETERS settings change the function without a parameter to show it: each is checked by its logits
    on every shape where it is valid (attention_scale on GPT-2 was exported as GPT-2's 1/sqrt(H) before)."""
    values = {"attention_scale": 0.5, "rope_base": 500.0, "norm_eps": 1e-2, "scale_tied_head": True}
    outcomes = {}
    for shape, settings in SHAPES.items():
        try:
            cfg = ModelConfig(**SMALL, **settings).replace(**{setting: values[setting]})
        except ConfigError:
            continue
        outcomes[shape] = _export_or_refuse(cfg, str(tmp_path / shape))
    assert outcomes, setting
    if setting == "attention_scale":
        assert outcomes == {"gpt2": "refused", "llama": "refused", "qwen3": "refused", "gpt_neox": "refused",
                            "bert": "refused", "t5": "t5"}


def test_a_refusal_names_the_settings_and_is_short():
    with pytest.raises(ConfigError) as e:
        hf.converter_for(ModelConfig(**SMALL, positional="alibi"))
    assert "gpt2 needs model.positional='learned' (got 'alibi')" in str(e.value)
    assert len(str(e.value)) < 400, str(e.value)
