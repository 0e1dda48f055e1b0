"""sweep.budgets left to the sweep (issue 20 §4): budgets and sizes that straddle the prior optimum with at least
min_steps steps for the run's own tokenizer, within sweep.max_hours; the dry run shows the plan, its time and why."""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest

from configs.sweeps import quick
from transformer.design import plan
from transformer.spec import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tokenizer_json(path: str, vocab: int) -> str:
    """A byte-level BPE tokenizer.json of `vocab` entries trained on a small generated text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghiklmnoprstuvwyz") for _ in range(rng.randint(2, 9))) for _ in range(6000)]
    text = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<bos>", "<eos>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)
    assert tok.get_vocab_size() == vocab
    return path


def _prior_n_opt(c, budget: float) -> float:
    """N_opt = C^0.5 / sqrt(6 · tokens_per_param) (Chinchilla's C = 6·N·D with D = tokens_per_param · N)."""
    return math.sqrt(budget / (6.0 * c.sweep.prior_tokens_per_param))


def test_quick_with_bytes_chooses_the_budgets_it_was_published_with():
    """The quick sweep leaves its budgets to the sweep; with the byte tokenizer it chooses 1e11, 2e11 and 4e11
    with the check at 1.6e12, so its runs (their ids) are those of the README's published quick sweep."""
    chosen = plan.design(quick.get_config(), preview=True)
    explicit = quick.get_config()
    explicit.sweep.update(budgets=(1e11, 2e11, 4e11), validate_ratio=0.0, validate_flops=1.6e12, max_hours=0.0)
    assert chosen.spec.budgets == (1e11, 2e11, 4e11) and chosen.spec.validate_flops == 1.6e12
    assert [r.run_id for r in chosen.runs] == [r.run_id for r in plan.design(explicit, preview=True).runs]
    assert any(n.startswith("budgets chosen by the sweep: 1e11, 2e11, 4e11") and "5e10 does not" in n
               for n in chosen.notes)


def test_a_real_tokenizer_gets_budgets_that_work_and_the_next_smaller_ones_do_not(tmp_path):
    """A 2k-entry tokenizer.json: the embedding is most of N, so the budgets move up; every grid run has at least
    min_steps steps, each budget's sizes straddle the prior optimum, and half the chosen budgets would not."""
    c = quick.get_config()
    c.base.data.tokenizer = _tokenizer_json(str(tmp_path / "tokenizer.json"), 2048)
    c.sweep.max_hours = 0.0
    p = plan.design(c, preview=True)
    budgets = p.spec.budgets
    assert budgets[0] > 1e11 and [b / budgets[0] for b in budgets] == [1.0, 2.0, 4.0]
    for budget in budgets:
        group = sorted((r for r in p.runs if r.budget == budget and r.role == "grid"), key=lambda r: r.size)
        assert len(group) == c.sweep.sizes_per_budget
        assert all(r.steps >= c.sweep.min_steps for r in group)
        assert group[0].size < _prior_n_opt(c, budget) < group[-1].size
        assert {r.config["model"]["vocab_size"] for r in group} == {2048}  # the tokenizer's, not bytes'
    smaller = quick.get_config()
    smaller.base.data.tokenizer = c.base.data.tokenizer
    smaller.sweep.update(budgets=tuple(b / 2 for b in budgets), validate_ratio=0.0, max_hours=0.0)
    try:
        notes = plan.design(smaller, preview=True).notes
    except ConfigError as e:  # the ladder cannot serve half the budgets
        assert "sweep.budgets" in str(e)
    else:  # or it can only by dropping a size for too few steps
        assert any("dropped" in n for n in notes), notes


def test_max_hours_bounds_the_sweep_and_lowers_the_sizes_before_refusing():
    c = quick.get_config()
    full = plan.design(c, preview=True)
    seconds = plan.total_seconds(full.runs, full.spec)
    c.sweep.max_hours = 0.75 * seconds / 3600  # the 4-size plan no longer fits; a 3-size one does
    fitted = plan.design(c, preview=True)
    assert fitted.spec.sizes_per_budget == 3 and plan.total_seconds(fitted.runs, fitted.spec) <= 0.75 * seconds
    assert any("sweep.sizes_per_budget lowered from 4 to 3" in n for n in fitted.notes)
    c.sweep.max_hours = 0.01
    with pytest.raises(ConfigError, match=r"sweep\.max_hours=0\.01: the sweep \(budgets .*, 3 sizes each\) is "
                                          r"estimated at .* raise sweep\.max_hours"):
        plan.design(c, preview=True)


def test_the_dry_run_shows_the_chosen_plan_its_time_and_why_or_refuses_before_writing(tmp_path):
    def dry(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "experiments.sweep", "--config=configs/sweeps/quick.py",
                               f"--workdir={tmp_path}/sweep", "--dry_run", *flags], cwd=REPO, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
    r = dry()
    assert r.returncode == 0, r.stderr[-2000:]
    assert "note: budgets chosen by the sweep: 1e11, 2e11, 4e11 FLOPs" in r.stdout
    assert "note: estimated time" in r.stdout and "within sweep.max_hours=0.5 h" in r.stdout
    r = dry("--config.sweep.max_hours=0.01")
    assert r.returncode == 2 and "error: sweep.max_hours=0.01" in r.stderr
    assert not os.path.exists(tmp_path / "sweep")
