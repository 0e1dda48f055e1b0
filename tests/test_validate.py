"""resolve.run_spec and the warm-up default: each dimension is checked under its own sharding rule,
seq_len against every positional scheme's max_len, and a shortened run needs no warm-up setting."""
from __future__ import annotations

import pytest

from configs.lm import get_config
from transformer.spec import ConfigError
from transformer.training import optimizer
from transformer.training.resolve import model_config, run_spec


def _check(config, num_devices: int = 8):
    return run_spec(config, model_config(config, 259), num_devices, 1).mesh.shape


def _with_rules(config, **overrides):
    config.mesh.rules = tuple((name, overrides.get(name, axes)) for name, axes in config.mesh.rules)
    return config


def test_d_ff_is_checked_under_the_mlp_rule_not_the_heads_rule():
    c = get_config("gpt2_tiny")
    c.mesh.data, c.mesh.tensor = 4, 2
    c.model.d_ff = 251  # odd: not divisible over 2 tensor shards
    _with_rules(c, heads=None)  # heads whole, the MLP still split over tensor: d_ff must divide
    with pytest.raises(ConfigError, match=r"model\.d_ff=251 must be divisible by 2.*'mlp'"):
        _check(c)
    c = _with_rules(get_config("gpt2_tiny"), mlp=None)  # the MLP whole: any d_ff is fine, heads still split
    c.mesh.data, c.mesh.tensor = 4, 2
    c.model.d_ff = 251
    assert tuple(_check(c)) == (4, 1, 2)


def test_kv_heads_are_checked_under_their_rule():
    c = get_config("llama_tiny")
    c.mesh.data, c.mesh.tensor = 2, 4
    c.model.num_kv_heads = 2
    c.data.seq_len = 64
    with pytest.raises(ConfigError, match=r"model\.num_kv_heads=2 must be divisible by 4"):
        _check(c)


@pytest.mark.parametrize("positional", ["rope", "learned", "sinusoidal"])
def test_seq_len_beyond_max_len_is_refused_for_every_positional_scheme(positional):
    c = get_config("llama_tiny")
    c.model.positional, c.model.max_len, c.data.seq_len = positional, 128, 256
    with pytest.raises(ConfigError, match=r"data\.seq_len=256 exceeds model\.max_len=128"):
        _check(c)
    c.model.positional = "none"  # no positions: max_len means nothing
    _check(c)


def test_a_shortened_run_warms_up_for_a_fraction_of_it():
    c = get_config("gpt2_tiny")
    c.train.steps = 50
    _check(c)  # the default warm-up (-1) is not refused for a 50-step run
    assert optimizer.warmup_steps(c.train) == 5
    schedule = optimizer.make_schedule(c.train)
    peak = float(c.train.learning_rate)
    assert float(schedule(0)) == pytest.approx(0.2 * peak)  # step 1 (count 0) trains at peak/5, not 0
    assert float(schedule(4)) == pytest.approx(peak)  # step 5 (count 4): the warm-up's last, at the peak
    assert float(schedule(5)) < peak  # step 6: the decay has begun
    assert float(schedule(2)) == pytest.approx(0.6 * peak)
    c.train.steps = 10_000
    assert optimizer.warmup_steps(c.train) == 100  # long runs keep the usual 100


def test_an_explicit_warm_up_longer_than_the_run_stays_an_error():
    c = get_config("gpt2_tiny")
    c.train.steps, c.train.warmup_steps = 50, 100
    with pytest.raises(ConfigError, match=r"train\.warmup_steps=100 must be between 0 and train\.steps=50"):
        _check(c)
