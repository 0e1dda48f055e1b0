"""The staged sweep plan (transformer/design/plan.py), run against a known loss law instead of training: the
LR calibration finds the law's best rate, re-centring follows the law's optimum where the prior is wrong,
wsd runs branch from the previous budget, and the validation run is designed from predictions.json, which is
written first."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from ml_collections import ConfigDict

from configs.sweeps import common
from sweep_fixture import law
from transformer.design import grid, plan
from transformer.design.spec import SweepSpec
from transformer.spec import TrainSpec
from transformer.sweeps import outcome, results, runner
from transformer.training.optimizer import decay_start

LR_C, LR_K = 0.4, -0.5  # the law's best learning rate, c·N^k (N total)


def _config(**sweep) -> ConfigDict:
    base = common.tiny_lm_base(seq_len=64, batch_size=16)
    settings = dict(name="plan", budgets=(1e11, 2e11, 4e11, 8e11), d_models=tuple(range(8, 257, 8)), head_dim=8,
                    num_layers=2, sizes_per_budget=5, size_span=6.0, prior_tokens_per_param=100.0,
                    lr_coefficient=0.2, lr_exponent=-0.5, lr_max=1.0, min_steps=5, fit_bootstrap=50)
    settings.update(sweep)
    return common.make(settings, base)


def _loss(run: dict, rng: np.random.Generator, sigma: float = 0.002) -> float:
    """The known law at the run's (N_eff, D), worse away from the best learning rate, with noise."""
    n_eff = run["flops_per_token"] / 6.0
    lr_penalty = 0.05 * math.log(run["learning_rate"] / (LR_C * run["params"] ** LR_K)) ** 2
    return float(law(n_eff, run["tokens"]) * (1 + lr_penalty) * math.exp(rng.normal(0, sigma)))


def _simulate(config: ConfigDict, workdir: str, seed: int = 0, stop_after: int = 100) -> tuple[plan.Plan, list]:
    """The runner's stage loop (runner.run_sweep) with the law in place of training; returns the final plan and
    the plans of every round."""
    rng, rounds = np.random.default_rng(seed), []
    for _ in range(stop_after):
        p, doc = runner.plan_and_write(workdir, config)
        rounds.append(p)
        if p.waiting == "prediction":
            outcome.predict(workdir, doc)
            continue
        recorded = {r["run_id"] for r in results.read_results(workdir)}
        todo = [r for r in doc["runs"] if r["run_id"] not in recorded]
        if not todo:
            return p, rounds
        for run in todo:
            summary = {"status": "ok", "eval_loss": _loss(run, rng), "wall_seconds": 1.0}
            results.append_result(workdir, runner.result_row(run, summary, "ok", None, 1.0, "isoflop"))
    raise AssertionError("the plan never completed")


def test_lr_calibration_extends_past_an_edge_and_finds_the_laws_rate(tmp_path):
    # the prior rule (0.2·N^-0.5) is half the law's best: with multipliers (0.25, 0.5, 1) the best rate is at the
    # high edge, and the scan extends upward (×2, where the best is still the edge, then ×4, which brackets it)
    c = _config(lr_calibration=dict(d_models=(16, 48), multipliers=(0.25, 0.5, 1.0)))
    first = plan.design(c)
    assert first.waiting == "the learning-rate calibration" and {r.role for r in first.runs} == {"lr"}
    assert len(first.runs) == 6 and all(r.budget == 1e11 for r in first.runs)
    final, rounds = _simulate(c, str(tmp_path))
    cal = [r for r in final.runs if r.role == "lr"]
    assert len(cal) == 10 and sorted({round(r.learning_rate / (0.2 * r.params ** -0.5), 2) for r in cal}) == [
        0.25, 0.5, 1.0, 2.0, 4.0]
    assert final.lr_fit["coefficient"] == pytest.approx(LR_C, rel=0.1) and final.lr_fit["exponent"] == LR_K
    for r in final.runs:
        if r.role == "grid":
            assert r.learning_rate == pytest.approx(final.lr_fit["coefficient"] * r.params ** LR_K, rel=1e-9)


def _law_optimum(c: ConfigDict, budget: float) -> float:
    """The total N of the ladder width with the law's lowest loss at `budget` (widths every 8)."""
    best = min(grid.ladder(SweepSpec.of(c), range(8, 513, 8)), key=lambda sm: law(sm[1]["flops_per_token"] / 6.0,
                                                                     budget / sm[1]["flops_per_token"]))
    return best[1]["params"]


def test_recentring_follows_the_optimum_where_the_prior_is_wrong(tmp_path):
    # a prior of 400 tokens per parameter puts the optimum ~3x too small; re-centred budgets follow the law's
    c = _config(prior_tokens_per_param=400.0, recenter=True)
    assert plan.design(c).waiting == "budget 1e11"  # each budget waits for the one before it
    recentred, rounds = _simulate(c, str(tmp_path / "recentred"))
    assert [p.waiting for p in rounds[:4]] == ["budget 1e11", "budget 2e11", "budget 4e11", "budget 8e11"]
    prior, _ = _simulate(_config(prior_tokens_per_param=400.0), str(tmp_path / "prior"))

    def miss(p: plan.Plan) -> float:
        """Mean |ln(centre of the designed sizes / the law's optimum)| over the budgets after the first."""
        out = []
        for budget in (2e11, 4e11, 8e11):
            sizes = [r.params for r in p.runs if r.role == "grid" and r.budget == budget]
            out.append(abs(np.mean(np.log(sizes)) - math.log(_law_optimum(c, budget))))
        return float(np.mean(out))

    assert miss(prior) > 0.6 and miss(recentred) < 0.4 * miss(prior), (miss(prior), miss(recentred))
    last = [r.params for r in recentred.runs if r.role == "grid" and r.budget == 8e11]
    assert min(last) < _law_optimum(c, 8e11) < max(last)


def test_wsd_branches_seeds_and_schedule_check_are_designed(tmp_path):
    c = _config(branch=True, warmup_tokens_per_param=1.0, seeds=dict(extra=2, sizes=2),
                schedule_check=dict(budget=2e11, schedule="cosine"))
    c.base.train.schedule = "wsd"
    runs = plan.design(c).runs
    grid_runs = {(r.budget, r.shape): r for r in runs if r.role == "grid" and r.seed == 0}
    branched = 0
    for (budget, shape), r in grid_runs.items():
        src = grid_runs.get((budget / 2, shape))
        if src is None:
            assert r.branch_from is None and r.start_step == 0
        else:
            branched += 1
            assert r.branch_from == src.run_id and r.start_step == decay_start(TrainSpec.from_config(src.config["train"])) > 0
            assert r.warmup_steps == src.warmup_steps  # N tokens of warm-up: the same at every budget
    assert branched >= 6
    seeds = [r for r in runs if r.seed != 0]
    assert sorted(r.seed for r in seeds) == [1, 1, 2, 2] and {r.budget for r in seeds} == {1e11}
    checks = [r for r in runs if r.role == "check"]
    assert len(checks) == 5 and {r.config["train"]["schedule"] for r in checks} == {"cosine"}
    assert {r.shape for r in checks} == {r.shape for (b, _), r in grid_runs.items() if b == 2e11}


@pytest.mark.slow
def test_the_validation_run_is_designed_from_the_prediction_written_first(tmp_path):
    c = _config(validate_flops=3.2e12)
    workdir = str(tmp_path)
    final, rounds = _simulate(c, workdir)
    assert [p.waiting for p in rounds[-3:]] == ["prediction", None, None]
    prediction = json.load(open(os.path.join(workdir, "fit", "predictions.json")))
    assert {"flops", "params", "tokens", "loss", "loss_ci95", "params_ci95", "written_at"} <= set(prediction)
    val = final.runs[-1]
    assert val.role == "validate" and val.flops == pytest.approx(3.2e12, rel=0.01)
    # the ladder's width whose N_eff is nearest the prediction (any multiple of head_dim)
    n_eff = val.flops_per_token / 6.0
    for d in (val.shape.d_model - 8, val.shape.d_model + 8):
        other = grid.ladder(SweepSpec.of(c), [d])[0][1]["flops_per_token"] / 6.0
        assert abs(math.log(n_eff / prediction["params"])) <= abs(math.log(other / prediction["params"]))
    out = outcome.finish(workdir, runner.load_sweep(workdir))
    checked = json.load(open(os.path.join(workdir, "fit", "validation.json")))
    assert checked["predicted_loss"] == prediction["loss"] and out["validation"] == checked
    assert abs(checked["relative_error"]) < 0.02  # the law is smooth and the noise small
    assert os.path.exists(os.path.join(workdir, "fit", "loss_frontier.png"))


def test_parallel_workers_start_a_branch_only_after_its_source_is_recorded(tmp_path, monkeypatch):
    """runner.run_parallel with stand-in worker processes (each records its run when it is polled): every
    branch starts after its source run is recorded, and every run is recorded once."""
    c = _config(branch=True, warmup_tokens_per_param=1.0, budgets=(1e11, 2e11))
    c.base.train.schedule = "wsd"
    workdir = str(tmp_path)
    p, doc = runner.plan_and_write(workdir, c)
    started: list[str] = []

    class Worker:
        def __init__(self, cmd, **kwargs):
            self.run = doc["runs"][int(cmd[-1].split("=")[1])]
            self.pid, self.returncode, self.polls = 0, None, 0
            started.append(self.run["run_id"])
            src = self.run.get("branch_from")
            assert src is None or src in {r["run_id"] for r in results.read_results(workdir)}, "branch before source"

        def poll(self):
            self.polls += 1
            if self.polls < 3:  # still training
                return None
            row = runner.result_row(self.run, {"status": "ok", "eval_loss": 2.0}, "ok", None, 1.0, "isoflop")
            results.append_result(workdir, row)
            self.returncode = 0
            return 0

    monkeypatch.setattr(runner.subprocess, "Popen", Worker)
    monkeypatch.setattr(runner, "worker_env", lambda slot, parallel: ({}, None))
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    assert runner.run_parallel(workdir, doc, parallel=2) == 0
    branches = [r for r in doc["runs"] if r.get("branch_from")]
    assert len(branches) >= 3 and sorted(started) == sorted(r["run_id"] for r in doc["runs"])
    for r in branches:
        assert started.index(r["branch_from"]) < started.index(r["run_id"])


def test_a_variant_sweep_trains_the_baselines_grid_and_compare_pairs_them(tmp_path):
    """sweep.grid_from: a variant (SwiGLU here) whose own prior would centre elsewhere trains the baseline's
    recentred sizes at every budget, designed at once; compare's grid check accepts the pair although each
    sweep calibrated its own learning rate and validated its own prediction."""
    from transformer.scaling import compare

    base_dir, var_dir = str(tmp_path / "base"), str(tmp_path / "var")
    seeds = dict(extra=1, sizes=2)  # replicates on the 2 sizes nearest each sweep's own centre: they would differ
    baseline, _ = _simulate(_config(prior_tokens_per_param=400.0, recenter=True, seeds=seeds), base_dir)
    variant_config = _config(prior_tokens_per_param=20.0, recenter=True, grid_from=base_dir, ffn_ratio=2.6667,
                             seeds=seeds)
    variant_config.base.model.activation = "swiglu"
    first = plan.design(variant_config)
    assert first.waiting is None  # no budget waits for another: the sizes are known
    variant, _ = _simulate(variant_config, var_dir)

    def widths(p: plan.Plan) -> dict:  # with repeats: seed replicates
        return {b: sorted(r.shape.d_model for r in p.runs if r.role == "grid" and r.budget == b)
                for b in (1e11, 2e11, 4e11, 8e11)}

    assert widths(variant) == widths(baseline)
    assert {r.config["model"]["activation"] for r in variant.runs} == {"swiglu"}
    own = plan.design(_config(prior_tokens_per_param=20.0, recenter=True), preview=True)
    assert widths(own)[1e11] != widths(baseline)[1e11]  # without grid_from the variant's first budget differs
    grids = [compare.read_grid(d, flag) for d, flag in ((base_dir, "--baseline"), (var_dir, "--variant"))]
    assert compare.grid_differences(*grids) == []


@pytest.mark.parametrize("setting, message", [
    ("missing", r"sweep.grid_from='.*missing': no .*sweep.json"),
    ("fewer budgets", r"has 0 grid sizes at budget 8e11 .*finish it first"),
])
def test_grid_from_errors_name_the_setting(tmp_path, setting, message):
    from transformer.spec import ConfigError

    if setting == "missing":
        c = _config(grid_from=str(tmp_path / "missing"))
    else:
        short = _config(budgets=(1e11, 2e11, 4e11))
        runner.plan_and_write(str(tmp_path), short)
        c = _config(grid_from=str(tmp_path))
    with pytest.raises(ConfigError, match=message):
        plan.design(c)


@pytest.mark.parametrize("cosine_losses, moved", [((1.50, 1.40, 1.45), False), ((1.40, 1.45, 1.50), True)])
def test_schedule_check_pairs_sizes_and_says_whether_the_best_size_moved(tmp_path, cosine_losses, moved):
    """wsd grid losses 1.52 / 1.41 / 1.47 (d40 best) against cosine check runs of the same shapes."""
    def row(d, loss, role, schedule):
        return {"run_id": f"d{d}-{role}", "role": role, "schedule": schedule, "status": "ok", "budget": 2.5e12,
                "d_model": d, "params": 1000 * d, "eval_loss": loss, "seed": 0}
    rows = [row(d, w, "grid", "wsd") for d, w in zip((32, 40, 48), (1.52, 1.41, 1.47))]
    rows += [row(d, c, "check", "cosine") for d, c in zip((32, 40, 48), cosine_losses)]
    rows.append(row(40, 9.0, "grid", "wsd") | {"seed": 1, "run_id": "d40-s1"})  # another seed: not paired
    out = outcome.schedule_check(str(tmp_path), rows)
    assert [(p["d_model"], p["wsd"], p["cosine"]) for p in out["pairs"]] == [
        (d, w, c) for d, w, c in zip((32, 40, 48), (1.52, 1.41, 1.47), cosine_losses)]
    assert out["best_size"]["wsd"] == 40000 and out["minimum_moved"] is moved
    assert out["mean_relative_difference"] == pytest.approx(
        np.mean([(w - c) / c for w, c in zip((1.52, 1.41, 1.47), cosine_losses)]))
    assert json.load(open(tmp_path / "fit" / "schedule_check.json")) == out


def test_a_grid_that_cannot_predict_ends_without_a_validation_run(tmp_path):
    """Sizes far from the optimum give no minimum and no frontier: predictions.json records that the fit could not predict
    (params and loss null, the reason), and the sweep finishes its grid without a validation run."""
    c = _config(budgets=(1e11, 2e11), validate_flops=8e11, prior_tokens_per_param=0.5)  # minima off the grid
    final, rounds = _simulate(c, str(tmp_path))
    assert "prediction" in [p.waiting for p in rounds]
    assert {r.role for r in final.runs} == {"grid"} and final.waiting is None
    pred = json.load(open(tmp_path / "fit" / "predictions.json"))
    assert pred["params"] is None and pred["loss"] is None and "cannot predict at 8e+11" in pred["note"]
    assert any("cannot predict" in n for n in final.notes)


def test_a_slurm_submission_holds_the_pending_runs_whose_branch_source_is_recorded(tmp_path):
    """runner.ready_to_submit (the SLURM launcher and its dry run): recorded runs are left out, and a branch
    waits until its source run has a results row."""
    doc = {"runs": [{"index": 0, "run_id": "a"}, {"index": 1, "run_id": "b", "branch_from": "a"},
                    {"index": 2, "run_id": "c"}, {"index": 3, "run_id": "d", "branch_from": "c"}]}
    results.append_result(str(tmp_path), {"run_id": "c", "status": "ok"})
    assert runner.ready_to_submit(str(tmp_path), doc) == [0, 3]
    results.append_result(str(tmp_path), {"run_id": "a", "status": "ok"})
    assert runner.ready_to_submit(str(tmp_path), doc) == [1, 3]
