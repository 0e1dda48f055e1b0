"""A sweep's plan: its runs, stage by stage, each stage designed from the recorded results of those before.

An IsoFLOP sweep's stages, in order (all but the budgets optional; transformer/design/defaults.py has the keys):
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
`design(config, rows, prediction)` is a pure function of the recorded results, so a rerun designs the same runs;
`preview=True` designs every stage from the priors (the dry run's plan and time estimate).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable

import ml_collections
import numpy as np

from transformer.spec import ConfigError, TrainSpec, decay_start, model_spec
from transformer.scaling import isoflop, lr_scan
from transformer.scaling.points import from_arrays
from transformer.design import grid
from transformer.design.grid import Run, Shape, format_flops, size_of

RECENTER_SLOPE_RANGE = 0.2   # a re-centring power law's exponent stays within prior_exponent ± this


@dataclasses.dataclass
class Plan:
    """runs: every run designed so far, in training order; waiting: None when every stage is designed, else
    what the next stage waits for ("prediction": the runner's fit of the grid); lr_fit: the calibration's
    lr_opt = c·N^k; prediction: the validation budget's prediction the validation run was designed from."""

    runs: list[Run]
    notes: list[str]
    waiting: str | None = None
    lr_fit: dict | None = None
    prediction: dict | None = None


def ladder(config: ml_collections.ConfigDict, d_models: Any = None) -> list[tuple[Shape, dict]]:
    """(shape, {params, params_non_embedding, flops_per_token}) for each d_model, in increasing width."""
    s, base = config.sweep, config.base
    vocab = grid.vocab_size(base)
    out = []
    for d in sorted(set(s.d_models if d_models is None else d_models)):
        shape = grid.shape_for(s, d)
        out.append((shape, grid.measure(grid.run_config(base, s, shape, vocab), vocab)))
    return out


def make_run(config: ml_collections.ConfigDict, shape: Shape, m: dict, budget: float, lr: float, *, role: str,
             stage: str, seed: int | None = None, schedule: str | None = None, label: str = "") -> Run:
    """One run at `budget` FLOPs: steps = round(C / (flops_per_token · tokens per step))."""
    s, base = config.sweep, config.base
    batch = grid.batch_size_for(base, s, budget, min(s.budgets))
    steps = round(budget / (m["flops_per_token"] * batch * base.data.seq_len))
    size = size_of(m, s)
    cfg = grid.run_config(base, s, shape, grid.vocab_size(base), steps, lr, batch, size, seed, schedule)
    rid = grid.run_id(label or f"{shape.name}-C{format_flops(budget)}", cfg)
    return Run(rid, 0, shape, float(budget), int(m["params"]), int(m["params_non_embedding"]), size,
               m["flops_per_token"], steps, batch, base.data.seq_len, float(lr), cfg.train.warmup_steps, cfg,
               role=role, stage=stage, seed=cfg.train.seed)


# ---------------------------------------------------------------- the learning-rate calibration stage


def _calibration(config: ml_collections.ConfigDict, rows: dict, lr_of: Callable[[float], float],
                 preview: bool) -> tuple[list[Run], dict | None, list[str]]:
    """(runs, lr fit or None while runs are pending, notes): multipliers extended by one step where a size's
    optimum is at an edge, also where diverged rates (worse than every finite one) leave it at the low edge."""
    s = config.sweep
    cal = s.lr_calibration
    budget = min(s.budgets)
    base_mults = sorted(float(x) for x in cal.multipliers)
    step = base_mults[1] / base_mults[0]
    sizes = ladder(config, cal.d_models)
    mults = [list(base_mults) for _ in sizes]
    runs: list[Run] = []
    for extension in range(cal.max_extensions + 1):  # in rounds, so the plan only grows at its end
        new = []
        for (shape, m), xs in zip(sizes, mults):
            lr0 = lr_of(size_of(m, s))
            new += [make_run(config, shape, m, budget, float(f"{lr0 * x:.4g}"), role="lr", stage="lr",
                             label=f"{shape.name}-lr{lr0 * x:.3g}") for x in xs]
        runs += [r for r in new if r.run_id not in {q.run_id for q in runs}]
        if preview or any(r.run_id not in rows for r in runs) or extension == cal.max_extensions:
            break
        grown = False
        for i, (shape, m) in enumerate(sizes):
            best = lr_scan.optimum(*_observations(runs, rows, shape))
            if best["at_edge"]:
                mults[i] = sorted(mults[i] + [mults[i][0] / step if best["edge"] == "low" else mults[i][-1] * step])
                grown = True
        if not grown:
            break
    if preview or any(r.run_id not in rows for r in runs):
        return runs, None, []
    for shape, _ in sizes:  # a run that failed without diverging is an error that names it
        _observations(runs, rows, shape)
    fit = lr_scan.analyze([rows[r.run_id] for r in runs], s.param_count,
                          exponent=None if cal.fit_exponent else s.lr_exponent)
    notes = [f"learning-rate calibration: {d['shape']} (N={d['size']:,}) diverged at learning rate "
             f"{', '.join(f'{lr:.3g}' for lr in d['learning_rates'])} (counted as worse than every finite rate)"
             for d in fit["diverged"]]
    return runs, fit, notes


def _observations(runs: list[Run], rows: dict, shape: Shape) -> tuple[list[float], list[float]]:
    """(learning rates, eval losses; inf where the run diverged) of `shape`'s recorded calibration runs. A run
    that failed without diverging is an error that names it: it says nothing about its rate."""
    mine = [rows[r.run_id] for r in runs if r.shape == shape]
    lost = [r for r in mine if not lr_scan.observed(r)]
    if lost:
        raise ConfigError(f"sweep.lr_calibration: run {lost[0]['run_id']} failed without diverging "
                          f"({str(lost[0].get('error'))[:200]}), so its learning rate is not measured; rerun the "
                          "sweep with --retry_failed to train it again")
    return [r["learning_rate"] for r in mine], [lr_scan.loss_of(r) for r in mine]


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


def centre(sweep: ml_collections.ConfigDict, budget: float, finished: list[tuple[float, list[Run]]],
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


def baseline_grid(config: ml_collections.ConfigDict) -> dict[float, tuple[list[int], list[int]]]:
    """sweep.grid_from: {budget: (the d_models of that sweep's grid runs, those with seed replicates)}, for each
    of this sweep's budgets."""
    s = config.sweep
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
        replicated = {r["d_model"] for r in grid_runs if r.get("seed", 0) != int(config.base.train.seed)}
        out[budget] = ds, sorted(replicated)
    return out


# ---------------------------------------------------------------- one budget


def _budget(config: ml_collections.ConfigDict, lad: list, budget: float, n_opt: float, how: str,
            lr_of: Callable[[float], float], previous: dict[Shape, Run],
            seeded: list[int] | None = None) -> tuple[list[Run], list[str]]:
    """A budget's grid runs (branched from `previous` where they can be), seed replicates (on the `seeded`
    widths if given, else the sizes nearest n_opt) and check runs."""
    s, base = config.sweep, config.base
    stage, notes = f"C{format_flops(budget)}", []
    kept = []
    for i, (shape, m) in enumerate(grid.pick_sizes(lad, s, n_opt)):
        run = make_run(config, shape, m, budget, lr_of(size_of(m, s)), role="grid", stage=stage)
        if i == 0 and run.steps < s.min_steps:
            need = s.min_steps * run.batch_size * run.seq_len * run.flops_per_token
            raise ConfigError(
                f"sweep.budgets: budget {format_flops(budget)} is too small for its smallest model {shape.name} "
                f"(N={run.size:,}): {run.steps} steps of {run.batch_size * run.seq_len} tokens < sweep.min_steps="
                f"{s.min_steps}; the smallest budget that works is {format_flops(need)} FLOPs (or lower "
                f"batch_size/seq_len)")
        if run.steps < s.min_steps:
            notes.append(f"budget {format_flops(budget)}: dropped {shape.name} (N={run.size:,}), only {run.steps} "
                         f"steps < sweep.min_steps={s.min_steps}")
        else:
            kept.append((run, m))
    sizes = [r.size for r, _ in kept]
    if len(kept) < s.min_sizes:
        raise ConfigError(
            f"sweep.budgets: budget {format_flops(budget)} has only {len(kept)} sizes with at least "
            f"sweep.min_steps={s.min_steps} steps; an IsoFLOP curve needs sweep.min_sizes={s.min_sizes}: raise the "
            f"budget, lower sweep.min_steps or add smaller d_models")
    if not sizes[0] < n_opt < sizes[-1]:
        message = (f"budget {format_flops(budget)}'s sizes (N {sizes[0]:,}..{sizes[-1]:,}) do not straddle its "
                   f"{how} optimum N_opt={n_opt:,.0f}; sweep.d_models spans N {size_of(lad[0][1], s):,}.."
                   f"{size_of(lad[-1][1], s):,}")
        if how == "prior":
            raise ConfigError(f"sweep.budgets: {message}: extend the ladder or change the budget")
        notes.append(f"{message}: extend sweep.d_models")
    runs = []
    for run, _ in kept:
        src = previous.get(run.shape)
        if (s.branch and src is not None and src.batch_size == run.batch_size
                and src.warmup_steps == run.warmup_steps and decay_start(src.config.train) is not None):
            run = dataclasses.replace(run, branch_from=src.run_id, start_step=decay_start(src.config.train))
        runs.append(run)
    base_seed = int(base.train.seed)
    if s.seeds.extra and budget in (tuple(s.seeds.budgets) or (min(s.budgets),)):
        nearest = sorted(kept, key=lambda rm: abs(math.log(rm[0].size / n_opt)))[:s.seeds.sizes]
        if seeded is not None:
            nearest = [rm for rm in kept if rm[0].shape.d_model in seeded]
        for run, m in sorted(nearest, key=lambda rm: rm[0].size):
            for k in range(1, s.seeds.extra + 1):
                runs.append(make_run(config, run.shape, m, budget, run.learning_rate, role="grid", stage=stage,
                                     seed=base_seed + k, label=f"{run.shape.name}-C{format_flops(budget)}-s{k}"))
    if s.schedule_check.budget and math.isclose(budget, s.schedule_check.budget, rel_tol=1e-9):
        name, checked = s.schedule_check.schedule, kept
        if s.schedule_check.sizes:
            checked = sorted(sorted(kept, key=lambda rm: abs(math.log(rm[0].size / n_opt)))[:s.schedule_check.sizes],
                             key=lambda rm: rm[0].size)
        runs += [make_run(config, run.shape, m, budget, run.learning_rate, role="check", stage=stage,
                          schedule=name, label=f"{run.shape.name}-C{format_flops(budget)}-{name}") for run, m in checked]
    return runs, notes


# ---------------------------------------------------------------- the validation stage


def validation_run(config: ml_collections.ConfigDict, prediction: dict, lr_of: Callable[[float], float]) -> Run:
    """The shape (any d_model that is a multiple of head_dim, up to 4× the ladder's widest) whose N, in the
    prediction's convention, is nearest the predicted N_opt, trained on C / flops_per_token tokens."""
    s = config.sweep
    widest = max(s.d_models)
    lad = ladder(config, range(s.head_dim, 4 * widest + 1, s.head_dim))
    key = {"eff": lambda m: m["flops_per_token"] / 6.0, "eff_no_attention": lambda m: m["flops_per_token_no_attention"] / 6.0,
           "total": lambda m: m["params"], "non_embedding": lambda m: m["params_non_embedding"],
           }[prediction.get("convention", "total")]
    shape, m = min(lad, key=lambda sm: abs(math.log(key(sm[1]) / prediction["params"])))
    return make_run(config, shape, m, prediction["flops"], lr_of(size_of(m, s)), role="validate",
                    stage="validate", label=f"{shape.name}-C{format_flops(prediction['flops'])}-validate")


def prior_prediction(config: ml_collections.ConfigDict) -> dict:
    """What the dry run assumes the fit will predict: the prior optimum at sweep.validate_flops."""
    s = config.sweep
    return {"flops": float(s.validate_flops), "params": grid.prior_optimum(s, s.validate_flops), "convention": "total"}


# ---------------------------------------------------------------- an LR scan (sweep.mode=lr_scan)


def lr_scan_runs(config: ml_collections.ConfigDict, lower: list[tuple[int, int]] = ()) -> list[Run]:
    """Every lr_scan size at every learning rate of the log grid, on a fixed token count, then for each (d_model,
    j) of `lower` that size at the grid's j-th rate below lr_min (in that order: the plan only grows at its end)."""
    s, base = config.sweep, config.base
    scan = s.lr_scan
    vocab, seq, batch = grid.vocab_size(base), base.data.seq_len, base.train.batch_size
    ratio = (scan.lr_max / scan.lr_min) ** (1.0 / (scan.num_lrs - 1))
    sizes = {}
    for shape, m in ladder(config, scan.d_models):
        size = size_of(m, s)
        steps = round((scan.tokens or scan.tokens_per_param * size) / (batch * seq))
        if steps < s.min_steps:
            raise ConfigError(f"sweep.lr_scan: {shape.name} (N={size:,}) gets only {steps} steps < "
                              f"sweep.min_steps={s.min_steps}; raise sweep.lr_scan.tokens_per_param or tokens")
        sizes[shape.d_model] = shape, m, size, steps
    todo = [(d, lr) for d in sizes for lr in np.geomspace(scan.lr_min, scan.lr_max, scan.num_lrs)]
    runs: list[Run] = []
    for d, lr in todo + [(d, scan.lr_min / ratio ** j) for d, j in lower]:
        shape, m, size, steps = sizes[d]
        lr = float(f"{lr:.4g}")
        cfg = grid.run_config(base, s, shape, vocab, steps, lr, batch, size)
        runs.append(Run(grid.run_id(f"{shape.name}-lr{lr:.3g}", cfg), 0, shape, None, int(m["params"]),
                        int(m["params_non_embedding"]), size, m["flops_per_token"], steps, batch, seq, lr,
                        cfg.train.warmup_steps, cfg, role="lr", stage="lr"))
    return runs


def _scan_plan(config: ml_collections.ConfigDict, rows: dict, preview: bool) -> Plan:
    """sweep.mode=lr_scan: the grid of rates, then, once recorded, round by round, the grid's next rate below
    the lowest for each size whose diverged rates leave its best rate at the low edge, at most as many as it has
    diverged rates. Runs that failed without diverging say nothing: the analysis leaves them out."""
    lower: list[tuple[int, int]] = []
    notes: list[str] = []
    while True:
        runs = lr_scan_runs(config, lower)
        if preview or any(r.run_id not in rows for r in runs):
            return Plan(runs, notes, waiting="the learning-rate scan" if lower else None)
        notes, grown = [], False
        for shape in dict.fromkeys(r.shape for r in runs):
            mine = [rows[r.run_id] for r in runs if r.shape == shape and lr_scan.observed(rows[r.run_id])]
            if len(mine) < 3 or not any(lr_scan.diverged(r) for r in mine):
                continue
            best = lr_scan.optimum([r["learning_rate"] for r in mine], [lr_scan.loss_of(r) for r in mine])
            done = sum(1 for d, _ in lower if d == shape.d_model)
            extend = best["at_edge"] and best["edge"] == "low" and done < len(best["diverged"])
            notes.append(f"learning-rate scan: {shape.name} diverged at learning rate "
                         f"{', '.join(f'{lr:.3g}' for lr in best['diverged'])} (counted as worse than every finite "
                         f"rate){'; its best rate is the lowest scanned: one more rate below it' if extend else ''}")
            if extend:
                lower.append((shape.d_model, done + 1))
                grown = True
        if not grown:
            return Plan(runs, notes)


# ---------------------------------------------------------------- the whole plan


def design(config: ml_collections.ConfigDict, rows: dict[str, dict] | None = None, prediction: dict | None = None,
           *, preview: bool = False) -> Plan:
    """The runs designed from `rows` (run_id → results row) so far; see the module docstring."""
    grid.validate_sweep(config)
    if config.sweep.mode == "lr_scan":
        return _numbered(_scan_plan(config, rows or {}, preview))
    s, rows = config.sweep, rows or {}
    recorded = lambda runs: preview or all(r.run_id in rows for r in runs)
    lr_of, lr_fit = grid.lr_rule(s), None
    runs: list[Run] = []
    notes: list[str] = []
    if s.lr_calibration.d_models:
        cal, lr_fit, cal_notes = _calibration(config, rows, lr_of, preview)
        runs += cal
        notes += cal_notes
        if lr_fit is None and not preview:
            return _numbered(Plan(runs, notes, waiting="the learning-rate calibration"))
        if lr_fit is not None:
            lr_of = grid.lr_rule(s, lr_fit)
            notes.append(f"learning rate from the calibration: {lr_fit['coefficient']:.4g}·N^{lr_fit['exponent']:.3f}")
    lad = ladder(config)
    baseline = baseline_grid(config) if s.grid_from else {}
    finished: list[tuple[float, list[Run]]] = []
    previous: dict[Shape, Run] = {}
    for budget in sorted(s.budgets):
        if baseline:  # the baseline's sizes, centred where they are
            lad_b, seeded = ladder(config, baseline[budget][0]), baseline[budget][1]
            n_opt, how = math.exp(np.mean(np.log([size_of(m, s) for _, m in lad_b]))), f"the grid of {s.grid_from}"
        else:
            lad_b, seeded = lad, None
            n_opt, how = centre(s, budget, [] if preview else finished, rows)
        b_runs, b_notes = _budget(config, lad_b, budget, n_opt, how, lr_of, previous, seeded)
        runs += b_runs
        notes += b_notes
        if s.recenter and not baseline and not recorded(b_runs):
            return _numbered(Plan(runs, notes, waiting=f"budget {format_flops(budget)}", lr_fit=lr_fit))
        finished.append((budget, [r for r in b_runs if r.role == "grid" and r.seed == int(config.base.train.seed)]))
        previous = {r.shape: r for r in finished[-1][1]}
    if s.validate_flops:
        if not recorded([r for r in runs if r.role == "grid"]):
            return _numbered(Plan(runs, notes, waiting="the grid", lr_fit=lr_fit))
        if prediction is None and not preview:
            return _numbered(Plan(runs, notes, waiting="prediction", lr_fit=lr_fit))
        if prediction is not None and prediction.get("params") is None:
            notes.append(prediction.get("note", "the fit could not predict: no validation run"))
        else:
            runs.append(validation_run(config, prediction or prior_prediction(config), lr_of))
    for r in runs:  # the training loop's own checks, before anything is trained
        check_run(r.config)
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):
        raise ConfigError("two runs of the sweep have the same config; check sweep.d_models for duplicates")
    return _numbered(Plan(runs, notes, None, lr_fit, prediction))


def check_run(config: ml_collections.ConfigDict) -> None:
    """A run config's checks from its resolve step that need no devices: the model and train specs, and the
    registry names (models.resolve) where the layers can be imported; without JAX (a machine that only designs
    and fits sweeps) the run's own resolve step checks those names before it trains."""
    cfg = model_spec(config, config.model.vocab_size)
    TrainSpec.from_config(config.train)
    try:
        from transformer.models import resolve  # the layers' registries: Flax
    except ImportError:
        return
    resolve(cfg)


def _numbered(plan: Plan) -> Plan:
    plan.runs = [dataclasses.replace(r, index=i) for i, r in enumerate(plan.runs)]
    return plan


def estimate_seconds(run: Run, sweep: ml_collections.ConfigDict) -> float:
    """The dry run's time estimate for one run (sweep.estimate_*); a branch trains from its start step."""
    step = run.batch_size * run.seq_len * run.flops_per_token / sweep.estimate_flops_per_second
    return (run.steps - run.start_step) * (step + sweep.estimate_step_overhead_s) + sweep.estimate_run_overhead_s
