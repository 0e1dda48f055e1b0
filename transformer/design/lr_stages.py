"""The sweep's learning-rate stages: the calibration before an IsoFLOP sweep's budgets (sweep.lr_calibration) and
the LR scan (sweep.mode=lr_scan), each extended where a size's best rate is at an edge, also where diverged rates
(worse than every finite one) leave it at the low edge. No JAX; plan.py joins the stages.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from transformer.design import grid
from transformer.design.grid import Run, Shape, size_of
from transformer.design.spec import SweepSpec
from transformer.scaling import lr_scan
from transformer.spec import ConfigError


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
    spec: SweepSpec | None = None  # the resolved spec it was designed from (chosen budgets filled in)


def calibration(s: SweepSpec, rows: dict, lr_of: Callable[[float], float],
                 preview: bool) -> tuple[list[Run], dict | None, list[str]]:
    """(runs, lr fit or None while runs are pending, notes): multipliers extended by one step where a size's
    optimum is at an edge, also where diverged rates (worse than every finite one) leave it at the low edge."""
    cal = s.lr_calibration
    budget = min(s.budgets)
    base_mults = sorted(float(x) for x in cal.multipliers)
    step = base_mults[1] / base_mults[0]
    sizes = grid.ladder(s, cal.d_models, "sweep.lr_calibration.d_models")
    mults = [list(base_mults) for _ in sizes]
    runs: list[Run] = []
    for extension in range(cal.max_extensions + 1):  # in rounds, so the plan only grows at its end
        new = []
        for (shape, m), xs in zip(sizes, mults):
            lr0 = lr_of(size_of(m, s))
            new += [grid.make_run(s, shape, m, budget, float(f"{lr0 * x:.4g}"), role="lr", stage="lr",
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



def lr_scan_runs(s: SweepSpec, lower: list[tuple[int, int]] = ()) -> list[Run]:
    """Every lr_scan size at every learning rate of the log grid, on a fixed token count, then for each (d_model,
    j) of `lower` that size at the grid's j-th rate below lr_min (in that order: the plan only grows at its end)."""
    base, scan = s.base, s.lr_scan
    vocab, seq, batch = grid.vocab_size(base), base["data"]["seq_len"], base["train"]["batch_size"]
    ratio = (scan.lr_max / scan.lr_min) ** (1.0 / (scan.num_lrs - 1))
    sizes = {}
    for shape, m in grid.ladder(s, scan.d_models, "sweep.lr_scan.d_models"):
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
                        cfg["train"]["warmup_steps"], cfg, role="lr", stage="lr"))
    return runs


def scan_plan(s: SweepSpec, rows: dict, preview: bool) -> Plan:
    """sweep.mode=lr_scan: the grid of rates, then, once recorded, round by round, the grid's next rate below
    the lowest for each size whose diverged rates leave its best rate at the low edge, at most as many as it has
    diverged rates. Runs that failed without diverging say nothing: the analysis leaves them out."""
    lower: list[tuple[int, int]] = []
    notes: list[str] = []
    while True:
        runs = lr_scan_runs(s, lower)
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
