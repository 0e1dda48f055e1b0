"""ModelConfig as the one source of model settings: one compute-dtype setting, the configs' model blocks
derived from its defaults, and logical axis names that mean one thing each."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from configs import lm, mlm, seq2seq
from configs.common import DEFAULT_RULES
from transformer.spec import ConfigError, ModelConfig
from transformer.models import build_model
from transformer.training.resolve import model_config


# ---------------------------------------------------------------- one compute dtype setting

def test_compute_dtype_is_one_setting():
    c = lm.get_config("gpt2_tiny")
    assert "dtype" not in c.model  # nothing to set there
    c.train.compute_dtype = "bfloat16"
    assert model_config(c, 259).dtype == "bfloat16"
    with pytest.raises(ConfigError, match="model.dtype is not a setting: the compute dtype is train.compute_dtype"):
        ModelConfig.from_dict({"dtype": "bfloat16"})
    # float16 is refused the same way wherever it comes from (it used to pass as a ModelConfig dtype)
    with pytest.raises(ConfigError, match=r"train.compute_dtype='float16' is not valid; choose one of float32, bfloat16"):
        ModelConfig(dtype="float16")
    c.train.compute_dtype = "float16"
    with pytest.raises(ConfigError, match=r"train.compute_dtype='float16' is not valid; choose one of float32, bfloat16"):
        model_config(c, 259)


# ---------------------------------------------------------------- one source of model defaults

@pytest.mark.parametrize("module", [lm, mlm, seq2seq], ids=["lm", "mlm", "seq2seq"])
def test_config_files_take_model_defaults_from_modelconfig(module):
    # a nested setting (model.lora) is a mapping in a config file
    defaults = {f.name: f.default.to_dict() if hasattr(f.default, "to_dict") else f.default
                for f in dataclasses.fields(ModelConfig)}
    for preset in module.PRESETS:
        model = module.get_config(preset).model.to_dict()
        assert set(model) == set(defaults) - {"dtype"}, preset  # every setting is there, dtype is not
        own = set(module.PRESETS[preset]) | {"family", "vocab_size"}
        assert {k: v for k, v in model.items() if k not in own} == {k: defaults[k] for k in model if k not in own}


# ---------------------------------------------------------------- logical axis names

@pytest.fixture
def activation_names(monkeypatch):
    seen = set()
    original = nn.with_logical_constraint

    def spy(x, names, *args, **kwargs):
        seen.add(tuple(names))
        return original(x, names, *args, **kwargs)
    monkeypatch.setattr(nn, "with_logical_constraint", spy)
    return seen


def _param_names(cfg: ModelConfig, *inputs) -> set[tuple[str, ...]]:
    boxed = jax.eval_shape(build_model(cfg).init, jax.random.PRNGKey(0), *inputs)["params"]
    return {tuple(spec) for spec in jax.tree.leaves(nn.get_partition_spec(boxed),
                                                   is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))}


def test_parameters_and_activations_have_their_own_axis_names(activation_names):
    """No name is both a parameter axis and an activation axis, so the rules' order decides nothing:
    every name tuple maps to the same mesh axes under the reversed rules."""
    small = dict(vocab_size=64, d_model=32, num_layers=1, num_heads=4, d_ff=64, max_len=16)
    tok = jnp.ones((2, 8), jnp.int32)
    params = set()
    params |= _param_names(ModelConfig(**small, positional="rope", activation="swiglu", num_kv_heads=2,
                                       tie_embeddings=False), tok)
    params |= _param_names(ModelConfig(**small, family="encoder", num_classes=3), tok)
    params |= _param_names(ModelConfig(**small, family="encoder_decoder"), tok, jnp.ones((2, 8), jnp.int32))
    activations = set(activation_names)
    assert activations and params
    param_axes = {n for names in params for n in names if n}
    act_axes = {n for names in activations for n in names if n}
    assert not param_axes & act_axes, param_axes & act_axes
    rule_names = [name for name, _ in DEFAULT_RULES]
    assert (param_axes | act_axes) <= set(rule_names) and len(rule_names) == len(set(rule_names))
    for names in params | activations | {("batch", "seq")}:
        assert nn.logical_to_mesh_axes(names, DEFAULT_RULES) == nn.logical_to_mesh_axes(
            names, tuple(reversed(DEFAULT_RULES))), names
    # what the rules say: FSDP shards parameters' width, never the activations' width
    assert nn.logical_to_mesh_axes(("batch", "seq", "act_embed"), DEFAULT_RULES) == jax.sharding.PartitionSpec(
        ("data", "fsdp"), None, None)
    assert nn.logical_to_mesh_axes(("embed", "mlp"), DEFAULT_RULES) == jax.sharding.PartitionSpec("fsdp", "tensor")
