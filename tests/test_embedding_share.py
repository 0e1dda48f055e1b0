"""A new sweep most of whose grid runs are embeddings is refused, naming what to change; fewer such runs are a
note; a sweep already recorded is never refused by the rule (grid.embedding_dominated)."""
from __future__ import annotations

import os

import pytest

from configs.sweeps import common
from transformer.design import plan
from transformer.spec import ConfigError
from transformer.sweeps import runner


def _config(d_models: tuple[int, ...], num_layers: int, **sweep):
    base = common.tiny_lm_base(seq_len=64, batch_size=16)  # the byte vocabulary (259 entries)
    settings = dict(name="emb", budgets=(1e11,), d_models=d_models, head_dim=4, num_layers=num_layers,
                    sizes_per_budget=4, size_span=4.0, min_steps=5, prior_tokens_per_param=200.0, validate_ratio=0.0, fit_bootstrap=10)
    settings.update(sweep)
    return common.make(settings, base)


NARROW = dict(d_models=(4, 8, 12, 16, 20, 24), num_layers=1)  # the sizes chosen: non-embedding 33-48% of N with 259 entries


def test_a_new_embedding_dominated_sweep_is_refused_before_anything_is_written(tmp_path):
    workdir = str(tmp_path / "s")
    with pytest.raises(ConfigError, match=r"most runs would measure their embeddings.*"
                                          r"sweep.min_non_embedding_fraction=0.5.*allow_embedding_dominated=True"):
        runner.plan_and_write(workdir, _config(**NARROW))
    assert not os.path.exists(os.path.join(workdir, "sweep.json"))


def test_allowed_or_recorded_it_runs_with_the_note(tmp_path):
    workdir = str(tmp_path / "s")
    p, doc = runner.plan_and_write(workdir, _config(**NARROW, allow_embedding_dominated=True))
    note = next(n for n in p.notes if "outside the embeddings" in n)
    assert "d12 33%" in note and "median run" in note
    # the recorded sweep reruns without the setting: its runs exist, the rule only notes them
    p2, _ = runner.plan_and_write(workdir, _config(**NARROW))
    assert [r.run_id for r in p2.runs] == [r.run_id for r in p.runs]


def test_a_few_narrow_runs_are_a_note_and_wide_ones_nothing():
    mixed = plan.design(_config(d_models=(8, 12, 16, 20, 24, 32), num_layers=2, budgets=(2e11,)), preview=True)
    shares = sorted(r.params_non_embedding / r.params for r in mixed.runs)
    assert shares[0] < 0.5 <= shares[len(shares) // 2]
    assert any("outside the embeddings" in n for n in mixed.notes)
    wide = plan.design(_config(d_models=(8, 12, 16, 20, 24, 32), num_layers=3, budgets=(1e11,)), preview=True)
    assert all(r.params_non_embedding >= r.params / 2 for r in wide.runs)
    assert not any("outside the embeddings" in n for n in wide.notes)


def test_the_fit_puts_the_non_embedding_exponent_beside_the_headline_where_the_share_varies(tmp_path):
    """The own-data quick sweep (docs/figures/own4k: a 4,096-entry BPE, 5-32% of N outside the embeddings)."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-m", "experiments.fit", "--sweep=docs/figures/own4k",
                        f"--out={tmp_path / 'own4k'}", "--bootstrap=20"], cwd=repo, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if "the share of N outside the embeddings varies" in x)
    assert "from 5% to 32%" in line and "convention non_embedding): approach2 a = 0.7" in line
    import json
    share = json.load(open(tmp_path / "own4k" / "fit.json"))["non_embedding_share"]
    assert 0.04 < share["min"] < 0.06 and 0.3 < share["max"] < 0.35
