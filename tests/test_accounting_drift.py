"""Accounting cannot drift from the models: every ModelConfig option, turned on in every family, counted
from the config (transformer/spec/accounting.py) and from the built model's parameter shapes (eval_shape,
nothing is initialised), and the FLOPs against XLA's count of the compiled forward pass. Each parameter's
logical axis names must be known to the mesh rules and to μP (transformer/layers/mup.py).

A new ModelConfig field fails `test_every_model_option_is_classified` until it is listed below: in OPTIONS
(with the values that change the model), SIZES or NO_PARAMETERS. Then the tests below count it."""
from __future__ import annotations

import dataclasses
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.common import DEFAULT_RULES
from transformer.layers import feedforward, mup, norms, positional
from transformer.models import build_model
from transformer.layers import lora
from transformer.layers.lora import RANK_AXIS
from transformer.models.blocks import LAYERS_AXIS
from transformer.spec import FAMILIES, NORM_POSITIONS, PARAMETRIZATIONS, ConfigError, LoraSpec, ModelConfig
from transformer.spec import flops_per_token, matmul_params, param_counts

# Options whose values change the parameters or the matmuls: every value is tried in every family.
OPTIONS: dict[str, tuple] = {
    "positional": positional.POSITIONAL_ENCODINGS,
    "activation": tuple(feedforward.ACTIVATIONS),
    "norm": tuple(norms.NORMS),
    "norm_position": NORM_POSITIONS,
    "use_bias": (True, False),
    "tie_embeddings": (True, False),
    "embedding_norm": (False, True),
    "scale_embeddings": (False, True),
    "qk_norm": (False, True),
    "parallel_block": (False, True),
    "num_kv_heads": (0, 1, 2),
    "head_dim": (0, 6),
    "sliding_window": (0, 3),
    "parametrization": PARAMETRIZATIONS,
    "scan_layers": (False, True),
    "num_encoder_layers": (0, 1),
    "num_classes": (0, 3),
    "scale_tied_head": (False, True),
    "lora": (LoraSpec(), LoraSpec(rank=2, targets="query,key,value,out,mlp_in,mlp_out"), LoraSpec(rank=3)),
    # each valid in the families whose layers it names (canonical JSON, as ModelConfig keeps it)
    "pruned_heads": ("", '{"encoder/blocks/layers_0/attention":[1]}', '{"blocks/layers_1/attention":[0,2]}',
                     '{"decoder/blocks/layers_0/attention":[3],"decoder/blocks/layers_1/cross_attention":[0,1]}'),
}
# Sizes: set to distinct values in BASE so that a swapped factor shows.
SIZES = ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_len", "relative_num_buckets")
# Options that change neither parameter shapes nor matmul counts (numerics, dtypes, memory, implementation).
NO_PARAMETERS = ("family", "rope_base", "norm_eps", "attention_impl", "dropout_rate", "dtype", "param_dtype", "remat",
                 "relative_max_distance", "attention_scale", "mup_base_width", "mup_base_head_dim")
BASE = dict(vocab_size=61, d_model=16, num_layers=2, num_heads=4, d_ff=24, max_len=13, relative_num_buckets=8,
            relative_max_distance=16, mup_base_width=8, attention_impl="einsum")
# Turned back to their base value, in this order, when a combination is not a valid config.
REPAIR = ("scale_tied_head", "norm_position", "parametrization", "scale_embeddings", "parallel_block", "num_classes",
          "tie_embeddings", "head_dim", "num_kv_heads", "sliding_window", "lora", "pruned_heads")
RANDOM_COMBINATIONS = 4


def _valid(family: str, **changes) -> ModelConfig | None:
    try:
        return ModelConfig(**{**BASE, "family": family, **changes})
    except ConfigError:
        return None


def _repaired(family: str, changes: dict) -> ModelConfig:
    for name in REPAIR:
        cfg = _valid(family, **changes)
        if cfg is not None:
            return cfg
        changes.pop(name, None)
    return ModelConfig(**{**BASE, "family": family, **changes})


def _combinations(family: str) -> list[ModelConfig]:
    """Configs that together take every valid value of every option in this family, many options at once:
    first every option's last value ("all on"), then random combinations (seeded); a ConfigError turns options
    back to the base (REPAIR) until valid; a value still untaken then gets a config of its own."""
    rng = np.random.RandomState(FAMILIES.index(family))
    configs = [_repaired(family, {name: values[-1] for name, values in OPTIONS.items()})]
    for _ in range(RANDOM_COMBINATIONS):
        configs.append(_repaired(family, {name: values[rng.randint(len(values))] for name, values in OPTIONS.items()}))
    taken = {(name, getattr(c, name)) for c in configs for name in OPTIONS}
    for name, values in OPTIONS.items():
        for value in values:
            alone = _valid(family, **{name: value})
            if (name, value) not in taken and alone is not None:
                configs.append(alone)
                taken |= {(n, getattr(alone, n)) for n in OPTIONS}
    return configs


CONFIGS = {f"{family}-{i}": cfg for family in FAMILIES for i, cfg in enumerate(_combinations(family))}


def _built_params(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{parameter path: shape} of the model cfg builds (jax.eval_shape: no array is made). Every parameter must
    also carry logical axis names that the mesh rules know and that μP can classify."""
    model = build_model(cfg)
    args = (jnp.zeros((1, 4), jnp.int32),) * (2 if cfg.family == "encoder_decoder" else 1)
    boxed = jax.eval_shape(lambda r: model.init(r, *args), jax.random.PRNGKey(0))["params"]
    mup.param_kinds(boxed)  # ValueError naming a parameter without names, or with names μP does not classify
    known = {name for name, _ in DEFAULT_RULES} | {LAYERS_AXIS, RANK_AXIS}  # these two map to no mesh axis
    for path, spec in jax.tree_util.tree_leaves_with_path(nn.get_partition_spec(boxed),
                                                          is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)):
        assert all(name in known for name in spec), (path, spec, "a logical axis name not in DEFAULT_RULES")
    return {"/".join(str(getattr(k, "key", k)) for k in path): tuple(a.shape)
            for path, a in jax.tree_util.tree_flatten_with_path(nn.unbox(boxed))[0]}


def _size(shapes: dict[str, tuple[int, ...]], keep=lambda path: True) -> int:
    return int(sum(np.prod(s) for p, s in shapes.items() if keep(p)))


def test_every_model_option_is_classified():
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    listed = [*OPTIONS, *SIZES, *NO_PARAMETERS]
    assert len(listed) == len(set(listed)), "a field is listed twice"
    assert fields == set(listed), (
        f"ModelConfig fields not classified in tests/test_accounting_drift.py: {sorted(fields - set(listed))} "
        f"(and listed but gone: {sorted(set(listed) - fields)}); put a new option in OPTIONS with its values")


def test_every_valid_value_is_counted_in_every_family():
    """The combinations leave out no (option, value) that is valid on its own in a family."""
    for family in FAMILIES:
        taken = {(name, getattr(c, name)) for key, c in CONFIGS.items() if c.family == family for name in OPTIONS}
        for name, values in OPTIONS.items():
            for value in values:
                assert (name, value) in taken or _valid(family, **{name: value}) is None, (family, name, value)
    assert any(c.qk_norm and c.parallel_block for c in CONFIGS.values())  # options together, not only alone


EMBEDDING_TABLES = ("token_embedding/", "position_embedding/", "relative_position_bias/")
NOT_COUNTED_AS_MATMUL = ("pooler/", "classifier/")  # once per sequence: left out of FLOPs per token


@pytest.mark.parametrize("key", list(CONFIGS))
def test_parameter_counts_equal_the_built_model(key):
    cfg = CONFIGS[key]
    shapes = _built_params(cfg)
    counts = param_counts(cfg)
    assert counts["total"] == _size(shapes), cfg
    embedding = _size(shapes, lambda p: any(t in p for t in EMBEDDING_TABLES))
    assert counts["embedding"] == embedding, cfg
    assert counts["non_embedding"] == counts["total"] - embedding
    matmul = ("/kernel", "/lora_a", "/lora_b")  # LoRA's adapters are matmuls too
    kernels = _size(shapes, lambda p: p.endswith(matmul) and not any(t in p for t in NOT_COUNTED_AS_MATMUL))
    vocab_head = not (cfg.family == "encoder" and cfg.num_classes)
    tied_head = cfg.vocab_size * cfg.d_model if (cfg.tie_embeddings and vocab_head) else 0
    assert matmul_params(cfg) == kernels + tied_head, cfg
    trained = _size(shapes, lambda p: lora.is_trained(cfg, tuple(p.split("/"))))
    assert counts["trainable"] == trained, cfg


def _xla_forward_flops(cfg: ModelConfig, seq_len: int) -> float:
    """XLA's FLOP count of one compiled forward pass over a (1, seq_len) batch (parameters abstract)."""
    model = build_model(cfg)
    tokens = (jax.ShapeDtypeStruct((1, seq_len), jnp.int32),) * (2 if cfg.family == "encoder_decoder" else 1)
    params = jax.eval_shape(lambda r: model.init(r, *(jnp.zeros(t.shape, t.dtype) for t in tokens)),
                            jax.random.PRNGKey(0))
    cost = jax.jit(model.apply).lower(params, *tokens).compile().cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


# The "all on" combination of each family, widened so that the matmuls dominate XLA's count (norms, softmax and
# activations are a few percent); only these are compiled. Unscanned: XLA counts a loop's body once.
FLOPS_CONFIGS = {key: CONFIGS[key].replace(d_model=128, num_heads=4, d_ff=256, vocab_size=256, max_len=64,
                                           scan_layers=False)
                 for key in (f"{family}-{i}" for family, i in itertools.product(FAMILIES, (0,)))}


@pytest.mark.parametrize("key", list(FLOPS_CONFIGS))
def test_flops_per_token_match_xla(key):
    cfg, T = FLOPS_CONFIGS[key], 64
    xla = _xla_forward_flops(cfg, T)
    # per token of T (encoder_decoder: per target token, its source of T tokens included); training = 3 × forward
    ours = flops_per_token(cfg, T)["with_attention"] / 3 * T
    assert 1.0 <= xla / ours <= 1.06, (xla / ours, cfg)
