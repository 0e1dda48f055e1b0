"""A diverged run in a learning-rate calibration or scan is an observation (worse than every finite rate), not an
error: the analysis, the calibration stage and the scan complete, say which rates diverged, and extend below a
size whose divergence leaves its best rate at the low edge (issue 19, hole 1). Plans are run against a known
loss law instead of training, as in tests/test_sweep_plan.py."""
from __future__ import annotations

import json
import math
import os
from typing import Callable

import pytest
from ml_collections import ConfigDict

from configs.sweeps import common
from sweep_fixture import law
from transformer.spec import ConfigError
from transformer.scaling import lr_scan
from transformer.design import plan
from transformer.sweeps import outcome, results, runner

LR_C, LR_K = 0.4, -0.5  # the law's best learning rate, c·N^k (N total)
NONFINITE = ("NonFiniteError: non-finite loss or gradient at step 7 (loss=nan); first non-finite gradient: "
             "params/embed. Lower train.learning_rate or raise train.warmup_steps (after 2 attempts)")


def _loss(run: dict) -> float:
    """The known law at the run's (N_eff, D), worse away from the law's best learning rate; no noise."""
    lr_penalty = 0.05 * math.log(run["learning_rate"] / (LR_C * run["params"] ** LR_K)) ** 2
    return float(law(run["flops_per_token"] / 6.0, run["tokens"]) * (1 + lr_penalty))


def _record(workdir: str, run: dict, diverges: Callable[[dict], bool], mode: str) -> None:
    """Records `run` as the runner would: failed with the loop's non-finite diagnosis where it `diverges`, else
    ok at the law's loss."""
    if diverges(run):
        row = runner.result_row(run, None, "failed", NONFINITE, 1.0, mode)
    else:
        row = runner.result_row(run, {"status": "ok", "eval_loss": _loss(run), "wall_seconds": 1.0}, "ok", None,
                                1.0, mode)
    results.append_result(workdir, row)


def _simulate(config: ConfigDict, workdir: str, diverges: Callable[[dict], bool]) -> list[plan.Plan]:
    """runner.run_sweep's stage loop with the law in place of training; the plans of every round."""
    rounds = []
    for _ in range(50):
        p, doc = runner.plan_and_write(workdir, config)
        rounds.append(p)
        if p.waiting == "prediction":
            outcome.predict(workdir, doc)
            continue
        recorded = {r["run_id"] for r in results.read_results(workdir)}
        todo = [r for r in doc["runs"] if r["run_id"] not in recorded]
        if not todo:
            return rounds
        for run in todo:
            _record(workdir, run, diverges, config.sweep.mode)
    raise AssertionError("the plan never completed")


def test_optimum_counts_a_diverged_rate_as_worse_than_every_finite_one():
    # the default multipliers (½, 1, 2) with 2× diverged: two finite points, bracketed by the divergence
    best = lr_scan.optimum([0.05, 0.1, 0.2], [3.1, 3.0, None])
    assert best["lr_opt"] == 0.1 and not best["at_edge"] and best["diverged"] == [0.2]
    # 1× and 2× diverged (one as NaN, as a non-finite eval loss): the best is the lowest rate, at the low edge
    low = lr_scan.optimum([0.05, 0.1, 0.2], [3.1, float("nan"), None])
    assert low["at_edge"] and low["edge"] == "low" and low["lr_opt"] == 0.05 and low["diverged"] == [0.1, 0.2]
    every = lr_scan.optimum([0.05, 0.1, 0.2], [None, None, math.inf])
    assert every["lr_opt"] is None and every["edge"] == "low"


def test_analysis_completes_with_diverged_runs_and_names_them():
    rows = []
    for n, opt in ((10_000, 0.02), (1_000_000, 0.002)):
        for lr in (0.001, 0.002, 0.004, 0.008, 0.016, 0.032):
            row = {"run_id": f"{n}-{lr}", "status": "ok", "params": n, "params_non_embedding": n, "learning_rate": lr,
                   "eval_loss": 2.0 + 0.3 * math.log(lr / opt) ** 2, "d_model": 8, "num_layers": 1, "error": None}
            if n == 1_000_000 and lr == 0.032:  # diverged under train.nonfinite="stop"
                row.update(status="failed", eval_loss=None, error=NONFINITE)
            if n == 1_000_000 and lr == 0.016:  # diverged under "skip": finished with a non-finite eval loss (null)
                row.update(eval_loss=None)
            rows.append(row)
    rows.append({**rows[0], "run_id": "killed", "status": "failed", "eval_loss": None, "learning_rate": 0.0005,
                 "error": "worker exited with code -9"})  # not an observation: left out, and named
    fit = lr_scan.analyze(rows)
    big = next(s for s in fit["sizes"] if s["size"] == 1_000_000)
    assert big["diverged"] == [0.016, 0.032] and big["lr_opt"] == pytest.approx(0.002, rel=1e-6)
    assert fit["diverged"] == [{"size": 1_000_000, "shape": "d8-L1", "learning_rates": [0.016, 0.032]}]
    assert any("diverged at learning rate 0.016, 0.032" in w for w in fit["warnings"])
    assert any("killed" in w and "--retry_failed" in w for w in fit["warnings"])
    assert fit["exponent"] == pytest.approx(math.log(0.1) / math.log(100), rel=1e-6)


def _isoflop(**sweep) -> ConfigDict:
    base = common.tiny_lm_base(seq_len=64, batch_size=16)
    settings = dict(name="plan", budgets=(1e11, 2e11), d_models=tuple(range(8, 257, 8)), head_dim=8,
                    num_layers=2, sizes_per_budget=4, size_span=6.0, prior_tokens_per_param=100.0,
                    lr_coefficient=0.2, lr_exponent=-0.5, lr_max=1.0, min_steps=5, fit_bootstrap=0)
    settings.update(sweep)
    return common.make(settings, base)


def test_a_calibration_with_diverged_runs_designs_the_next_stage_and_extends_downward(tmp_path):
    # the rule gives 0.2·N^-0.5; the default multipliers (½, 1, 2) scan 0.1, 0.2, 0.4 (·N^-0.5). d16 diverges at
    # 2× (its best, 1×, is bracketed by the divergence); d48 diverges at 1× and 2×: its best is at the low edge,
    # so the calibration adds ¼× below it instead of raising
    c = _isoflop(lr_calibration=dict(d_models=(16, 48)))
    workdir = str(tmp_path)
    above = {16: 0.3, 48: 0.15}  # in units of N^-0.5
    rounds = _simulate(c, workdir, lambda run: run["role"] == "lr"
                       and run["learning_rate"] > above[run["d_model"]] * run["params"] ** -0.5)
    assert rounds[0].waiting == "the learning-rate calibration" and len(rounds[0].runs) == 6
    second = rounds[1]  # designed from the first round's results, one of which diverged
    added = [r for r in second.runs if r.run_id not in {q.run_id for q in rounds[0].runs}]
    assert [(r.shape.d_model, round(r.learning_rate / (0.2 * r.params ** -0.5), 3)) for r in added] == [(48, 0.25)]
    final = rounds[-1]
    assert final.waiting is None and any(r.role == "grid" for r in final.runs)
    by_width = {s["shape"]: s for s in final.lr_fit["sizes"]}
    d16 = next(s for k, s in by_width.items() if k.startswith("d16"))
    d48 = next(s for k, s in by_width.items() if k.startswith("d48"))
    assert d16["lr_opt"] == pytest.approx(0.2 * d16["size"] ** -0.5, rel=1e-3) and len(d16["diverged"]) == 1
    assert d48["lr_opt"] == pytest.approx(0.1 * d48["size"] ** -0.5, rel=1e-3) and len(d48["diverged"]) == 2
    assert sum("diverged at learning rate" in n for n in final.notes) == 2
    doc = runner.load_sweep(workdir)
    assert doc["lr_fit"]["diverged"] and any("diverged" in n for n in doc["notes"])


def test_a_calibration_run_that_failed_otherwise_is_one_clear_error(tmp_path):
    c = _isoflop(lr_calibration=dict(d_models=(16, 48)))
    workdir = str(tmp_path)
    _, doc = runner.plan_and_write(workdir, c)
    for i, run in enumerate(doc["runs"]):
        if i == 0:
            results.append_result(workdir, runner.result_row(run, None, "failed", "worker exited with code -9",
                                                             0.0, "isoflop"))
        else:
            _record(workdir, run, lambda run: False, "isoflop")
    with pytest.raises(ConfigError, match=r"sweep.lr_calibration: run .* failed without diverging.*--retry_failed"):
        runner.plan_and_write(workdir, c)


def _scan_config() -> ConfigDict:
    return common.make(dict(name="scan", mode="lr_scan", head_dim=8, num_layers=2, min_steps=5,
                            lr_scan=dict(d_models=(16, 48), lr_min=0.002, lr_max=0.032, num_lrs=5, tokens=200_000)),
                       common.tiny_lm_base(seq_len=64, batch_size=16))


def test_an_lr_scan_with_diverged_rates_completes_and_extends_below_the_low_edge(tmp_path):
    # the law's best rate is ≈0.0037 for d16 and ≈0.0015 for d48; d48 diverges above 0.0025, so of 0.002..0.032
    # only 0.002 is finite: the scan adds 0.001 below it, which brackets d48's best at 0.002
    c, workdir = _scan_config(), str(tmp_path)
    rounds = _simulate(c, workdir, lambda run: run["d_model"] == 48 and run["learning_rate"] > 0.0025)
    assert rounds[0].waiting is None and len(rounds[0].runs) == 10
    extended = rounds[1]
    assert extended.waiting == "the learning-rate scan" and len(extended.runs) == 11
    assert (extended.runs[-1].shape.d_model, extended.runs[-1].learning_rate) == (48, 0.001)
    assert any("d48-L2 diverged at learning rate 0.004, 0.008, 0.016, 0.032" in n for n in extended.notes)
    assert rounds[-1].waiting is None and len(rounds[-1].runs) == 11
    doc = runner.load_sweep(workdir)
    fit = outcome.finish(workdir, doc)
    d48 = next(s for s in fit["sizes"] if s["shape"] == "d48-L2")
    assert d48["lr_opt"] == 0.002 and not d48["at_edge"] and d48["diverged"] == [0.004, 0.008, 0.016, 0.032]
    assert json.load(open(os.path.join(workdir, "lr_fit.json")))["diverged"][0]["shape"] == "d48-L2"
    assert os.path.getsize(os.path.join(workdir, "lr_scan.png")) > 0


def test_finish_once_refits_an_lr_scan_extended_after_its_first_fit(tmp_path):
    """A SLURM worker fits a scan whose every run is recorded (--fit_when_done); when the scan is extended below
    a diverged size afterwards, the worker that records the last added run fits it again."""
    c, workdir = _scan_config(), str(tmp_path)
    diverges = lambda run: run["d_model"] == 48 and run["learning_rate"] > 0.0025
    _, doc = runner.plan_and_write(workdir, c)
    for run in doc["runs"]:
        _record(workdir, run, diverges, "lr_scan")
    first = outcome.finish_once(workdir, doc)
    assert first is not None and next(s for s in first["sizes"] if s["shape"] == "d48-L2")["at_edge"]
    assert outcome.finish_once(workdir, doc) is None  # fitted: nothing to do
    p, doc = runner.plan_and_write(workdir, c)
    assert p.waiting == "the learning-rate scan"
    _record(workdir, doc["runs"][-1], diverges, "lr_scan")
    p, doc = runner.plan_and_write(workdir, c)
    assert p.waiting is None
    again = outcome.finish_once(workdir, doc)
    assert again is not None and not next(s for s in again["sizes"] if s["shape"] == "d48-L2")["at_edge"]
