"""A sweep's plan: its runs, stage by stage, each stage designed from the recorded results of those before.

An IsoFLOP sweep's stages, in order (all but the budgets optional; transformer/design/spec.py has the keys; the
budgets themselves may be left to the sweep: design/budgets.py):
  lr         sweep.lr_calibration: a few sizes at the smallest budget's compute (so at the tokens per parameter
             the sweep uses), each at the rule's learning rate × each multiplier, extended by one step on the
             side where a size's best rate is at the edge; lr_opt = c·N^k refitted from the optima sets every
             later run's learning rate (transformer/scaling/lr_scan.py).
  C<budget>  each budget, smallest first: sizes_per_budget ladder shapes log-evenly spaced over size_span around
             the predicted optimum: the prior N_opt = G·C^a or, with sweep.recenter, the power law through the
             minima of the budgets already finished (such a budget is designed once those are recorded); seed
             replicates (sweep.seeds); at sweep.schedule_check.budget the same runs under another schedule (role
             "check": reported, not fitted). With base.train.schedule=wsd and sweep.branch, a size's run
             continues from the decay start of the same shape's run at the previous budget: until then the two
             are one run (Hägele et al. 2024), so a size costs about its longest run plus the decays.
  validate   sweep.validate_flops: once every grid run is recorded the runner fits them and writes the
             prediction at that budget (DIR/fit/predictions.json) before the predicted compute-optimal model is
             designed here and trained.
The learning-rate stages (calibration, LR scan) are in lr_stages.py.
`design(config, rows, prediction)` is a pure function of the recorded results (rows as sweeps/execute.read_rows
gives them: each status ok / diverged / failed by the sweep's one failure rule), so a rerun designs the same runs;
`preview=True` designs every stage from the priors (the dry run's plan and time estimate).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable

import numpy as np

from transformer.design import budgets, grid
from transformer.design.estimate import (  # the time estimate; re-exported: plan's names since before
    ONE_PROCESS, Schedule, device_seconds, estimate_seconds, packed_seconds, total_seconds, unit_seconds)
from transformer.design.grid import Run, Shape, format_flops, size_of
from transformer.design.lr_stages import Plan, calibration, scan_plan
from transformer.design.spec import SweepSpec
from transformer.scaling import isoflop
from transformer.scaling.points import from_arrays
from transformer.spec import ConfigError, TrainSpec, model_spec

__all__ = ["Plan", "design", "estimate_seconds", "device_seconds", "unit_seconds", "packed_seconds", "total_seconds",
           "Schedule", "ONE_PROCESS", "check_run", "centre", "baseline_grid", "validation_run", "prior_prediction"]

RECENTER_SLOPE_RANGE = 0.2   # a re-centring power law's exponent stays within prior_exponent ± this


# ---------------------------------------------------------------- where each budget's sizes sit


def _budget_minimum(runs: list[Run], rows: dict) -> dict:
    """The finished budget's minimum (isoflop.budget_minimum on its grid runs, N as the sweep counts it)."""
    done = [(r, rows[r.run_id]) for r in runs if rows.get(r.run_id, {}).get("status") == "ok"
            and rows[r.run_id].get("eval_loss") is not None]
    if len(done) < 3:
        return {"reason": f"{len(done)} finished runs"}
    pts = from_arrays([r.size for r, _ in done], [row["tokens"] for _, row in done],
                      [row["eval_loss"] for _, row in done], flops=[row["flops"] for _, row in done],
                      ids=[r.run_id for r, _ in done])
    return isoflop.budget_minimum(pts, np.arange(len(done)))


def centre(sweep: SweepSpec, budget: float, finished: list[tuple[float, list[Run]]],
           rows: dict) -> tuple[float, str]:
    """(N at the centre of `budget`'s sizes, how it was found): the prior, or (sweep.recenter) the power law
    through the finished budgets' minima (its exponent within the prior's ± RECENTER_SLOPE_RANGE), one minimum
    moved along the prior's exponent, or, with none, the previous budget's best size at an edge moved so."""
    prior = grid.prior_optimum(sweep, budget)
    if not sweep.recenter or not finished:
        return prior, "prior"
    a = sweep.prior_exponent
    minima = [(c, _budget_minimum(runs, rows)) for c, runs in finished]
    found = [(c, m["N_opt"]) for c, m in minima if "N_opt" in m]
    if len(found) >= 2:
        x, y = np.log([c for c, _ in found]), np.log([n for _, n in found])
        slope = float(np.clip(np.polyfit(x, y, 1)[0], a - RECENTER_SLOPE_RANGE, a + RECENTER_SLOPE_RANGE))
        level = float(np.mean(y - slope * x))
        return math.exp(level + slope * math.log(budget)), f"re-centred on {len(found)} budgets' minima (a={slope:.2f})"
    if found:
        c, n = found[-1]
        return n * (budget / c) ** a, f"re-centred on budget {format_flops(c)}'s minimum"
    c, m = minima[-1]
    if "size_loss" in m and len(m["size_loss"]) >= 3:
        best = int(np.argmin(m["size_loss"]))
        return m["sizes"][best] * (budget / c) ** a, f"moved to budget {format_flops(c)}'s best size (at an edge)"
    return prior, "prior (no finished budget has a minimum)"


def baseline_grid(s: SweepSpec) -> dict[float, tuple[list[int], list[int]]]:
    """sweep.grid_from: {budget: (the d_models of that sweep's grid runs, those with seed replicates)}, for each
    of this sweep's budgets."""
    path = os.path.join(os.path.expanduser(s.grid_from), "sweep.json")
    if not os.path.isfile(path):
        raise ConfigError(f"sweep.grid_from={s.grid_from!r}: no {path}; name the directory of a baseline IsoFLOP "
                          "sweep (its --workdir)")
    with open(path) as f:
        doc = json.load(f)
    if doc.get("mode") != "isoflop":
        raise ConfigError(f"sweep.grid_from={s.grid_from!r} is an {doc.get('mode')} sweep, not an IsoFLOP sweep")
    out = {}
    for budget in s.budgets:
        grid_runs = [r for r in doc["runs"] if r.get("role", "grid") == "grid"
                     and math.isclose(r["budget"], budget, rel_tol=1e-9)]
        ds = sorted({r["d_model"] for r in grid_runs})
        if len(ds) < s.sizes_per_budget:
            raise ConfigError(f"sweep.grid_from={s.grid_from!r} has {len(ds)} grid sizes at budget "
                              f"{format_flops(budget)} (this sweep's sizes_per_budget is {s.sizes_per_budget}): "
                              "its budgets differ, or it has not designed that budget yet (finish it first)")
        if any(d % s.head_dim for d in ds):
            raise ConfigError(f"sweep.grid_from={s.grid_from!r}: its d_models {ds} are not multiples of this "
                              f"sweep's head_dim={s.head_dim}")
        replicated = {r["d_model"] for r in grid_runs if r.get("seed", 0) != int(s.base["train"]["seed"])}
        out[budget] = ds, sorted(replicated)
    return out


# ---------------------------------------------------------------- one budget


def _budget(s: SweepSpec, lad: list, budget: float, n_opt: float, how: str, lr_of: Callable[[float], float],
            previous: dict[Shape, Run], seeded: list[int] | None = None) -> tuple[list[Run], list[str]]:
    """A budget's grid runs (branched from `previous` where they can be), seed replicates (on the `seeded`
    widths if given, else the sizes nearest n_opt) and check runs."""
    stage = f"C{format_flops(budget)}"
    kept, notes = grid.budget_sizes(s, lad, budget, n_opt, how, lr_of)
    runs = []
    for run, _ in kept:
        src = previous.get(run.shape)
        start = TrainSpec.from_config(src.config["train"]).decay_start if src is not None else None
        if s.branch and start is not None and src.batch_size == run.batch_size and src.warmup_steps == run.warmup_steps:
            run = dataclasses.replace(run, branch_from=src.run_id, start_step=start)
        runs.append(run)
    base_seed = int(s.base["train"]["seed"])
    if s.seeds.extra and budget in (tuple(s.seeds.budgets) or (min(s.budgets),)):
        nearest = sorted(kept, key=lambda rm: abs(math.log(rm[0].size / n_opt)))[:s.seeds.sizes]
        if seeded is not None:
            nearest = [rm for rm in kept if rm[0].shape.d_model in seeded]
        for run, m in sorted(nearest, key=lambda rm: rm[0].size):
            for k in range(1, s.seeds.extra + 1):
                runs.append(grid.make_run(s, run.shape, m, budget, run.learning_rate, role="grid", stage=stage,
                                          seed=base_seed + k, label=f"{run.shape.name}-C{format_flops(budget)}-s{k}"))
    if s.schedule_check.budget and math.isclose(budget, s.schedule_check.budget, rel_tol=1e-9):
        name, checked = s.schedule_check.schedule, kept
        if s.schedule_check.sizes:
            checked = sorted(sorted(kept, key=lambda rm: abs(math.log(rm[0].size / n_opt)))[:s.schedule_check.sizes],
                             key=lambda rm: rm[0].size)
        runs += [grid.make_run(s, run.shape, m, budget, run.learning_rate, role="check", stage=stage, schedule=name,
                               label=f"{run.shape.name}-C{format_flops(budget)}-{name}") for run, m in checked]
    return runs, notes


# ---------------------------------------------------------------- the validation stage


def validation_run(s: SweepSpec, prediction: dict, lr_of: Callable[[float], float]) -> Run:
    """The shape (any d_model that is a multiple of head_dim, up to 4× the ladder's widest, with at least
    sweep.min_non_embedding_fraction of its parameters outside the embeddings) whose N, in the
    prediction's convention, is nearest the predicted N_opt, trained on C / flops_per_token tokens."""
    widest = max(s.d_models)
    lad = grid.ladder(s, range(s.head_dim, 4 * widest + 1, s.head_dim))
    key = {"eff": lambda m: m["flops_per_token"] / 6.0, "eff_no_attention": lambda m: m["flops_per_token_no_attention"] / 6.0,
           "total": lambda m: m["params"], "non_embedding": lambda m: m["params_non_embedding"],
           }[prediction.get("convention", "total")]
    shape, m = min(lad, key=lambda sm: abs(math.log(key(sm[1]) / prediction["params"])))
    return grid.make_run(s, shape, m, prediction["flops"], lr_of(size_of(m, s)), role="validate",
                    stage="validate", label=f"{shape.name}-C{format_flops(prediction['flops'])}-validate")


def prior_prediction(s: SweepSpec) -> dict:
    """What the dry run assumes the fit will predict: the prior optimum at sweep.validate_flops."""
    return {"flops": float(s.validate_flops), "params": grid.prior_optimum(s, s.validate_flops), "convention": "total"}


# ---------------------------------------------------------------- the whole plan


def design(config: Any, rows: dict[str, dict] | None = None, prediction: dict | None = None, *,
           preview: bool = False, schedule: Schedule = ONE_PROCESS) -> Plan:
    """The runs designed from `rows` (run_id → results row) so far; see the module docstring. `config`: a sweep
    config (ConfigDict or mapping with `sweep` and `base`) or its SweepSpec. The plan's `spec` is the resolved
    spec (the budgets the sweep chose, validate_flops from validate_ratio). `schedule`: how the runs will train
    (estimate.Schedule, from the sweeps layer: packed on a GPU's workers, or one after another in one process),
    which the whole sweep's estimate that sweep.max_hours bounds follows."""
    s = SweepSpec.of(config)
    if s.mode == "lr_scan":
        return _numbered(dataclasses.replace(scan_plan(s, rows or {}, preview), spec=s))
    s, notes = budgets.resolve(s, lambda c: total_seconds(design(c, preview=True).runs, c, schedule), schedule.how)
    notes = [n for n in [grid.left_out(s)] if n] + notes
    rows = rows or {}
    recorded = lambda runs: preview or all(r.run_id in rows for r in runs)
    lr_of, lr_fit = grid.lr_rule(s), None
    runs: list[Run] = []
    plan = lambda **kw: _numbered(Plan(runs, notes + [n for n in [grid.embedding_dominated(
        [r.describe() for r in runs], s)] if n], spec=s, **kw))
    if s.lr_calibration.d_models:
        cal, lr_fit, cal_notes = calibration(s, rows, lr_of, preview)
        runs += cal
        notes += cal_notes
        if lr_fit is None and not preview:
            return plan(waiting="the learning-rate calibration")
        if lr_fit is not None:
            lr_of = grid.lr_rule(s, lr_fit)
            notes.append(f"learning rate from the calibration: {lr_fit['coefficient']:.4g}·N^{lr_fit['exponent']:.3f}")
    lad = grid.ladder(s)
    baseline = baseline_grid(s) if s.grid_from else {}
    finished: list[tuple[float, list[Run]]] = []
    previous: dict[Shape, Run] = {}
    for budget in sorted(s.budgets):
        if baseline:  # the baseline's sizes, centred where they are
            lad_b, seeded = grid.ladder(s, baseline[budget][0], "sweep.grid_from"), baseline[budget][1]
            n_opt, how = math.exp(np.mean(np.log([size_of(m, s) for _, m in lad_b]))), f"the grid of {s.grid_from}"
        else:
            lad_b, seeded = lad, None
            n_opt, how = centre(s, budget, [] if preview else finished, rows)
        b_runs, b_notes = _budget(s, lad_b, budget, n_opt, how, lr_of, previous, seeded)
        runs += b_runs
        notes += b_notes
        if s.recenter and not baseline and not recorded(b_runs):
            return plan(waiting=f"budget {format_flops(budget)}", lr_fit=lr_fit)
        finished.append((budget, [r for r in b_runs if r.role == "grid" and r.seed == int(s.base["train"]["seed"])]))
        previous = {r.shape: r for r in finished[-1][1]}
    if s.validate_flops:
        if not recorded([r for r in runs if r.role == "grid"]):
            return plan(waiting="the grid", lr_fit=lr_fit)
        if prediction is None and not preview:
            return plan(waiting="prediction", lr_fit=lr_fit)
        if prediction is not None and prediction.get("params") is None:
            notes.append(prediction.get("note", "the fit could not predict: no validation run"))
        else:
            runs.append(validation_run(s, prediction or prior_prediction(s), lr_of))
    for r in runs:  # the training loop's own checks, before anything is trained
        check_run(r.config)
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):
        raise ConfigError("two runs of the sweep have the same config; check sweep.d_models for duplicates")
    return plan(lr_fit=lr_fit, prediction=prediction)


def check_run(config: dict) -> None:
    """A run config's checks from its resolve step that need no devices: the model and train specs, and the
    registry names (models.resolve) where the layers can be imported; without JAX (a machine that only designs
    and fits sweeps) the run's own resolve step checks those names before it trains."""
    cfg = model_spec(config, config["model"]["vocab_size"])
    TrainSpec.from_config(config["train"])
    try:
        from transformer.models import resolve  # the layers' registries: Flax
    except ImportError:
        return
    resolve(cfg)


def _numbered(plan: Plan) -> Plan:
    plan.runs = [dataclasses.replace(r, index=i) for i, r in enumerate(plan.runs)]
    return plan
