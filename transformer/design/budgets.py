"""The sweep's budgets when the config leaves them to it (sweep.budgets empty), and its time limit.

The embedding's share of N and of the FLOPs per token depends on the vocabulary, so budgets that suit the byte
tokenizer do not suit a 6k or 32k one. Given the ladder measured with the run's own tokenizer, the sweep takes
sweep.num_budgets budgets sweep.budget_ratio apart, the first the smallest of ANCHOR · budget_ratio^j (j an integer,
so the choice is stable and the byte tokenizer's quick sweep keeps its 1e11, 2e11, 4e11) at which every budget's
sizes_per_budget sizes all have at least sweep.min_steps steps and straddle the prior optimum N_opt = G·C^a
(grid.budget_sizes, the check an explicit budget gets, here without dropping a size). sweep.max_hours then bounds
the whole sweep's estimated time (sweep.estimate_*, every stage from the priors, packed as the sweep will train:
design/estimate.py): a plan that does not fit is one ConfigError that says what it would take. No JAX.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from transformer.design import grid
from transformer.design.grid import format_flops
from transformer.design.spec import SweepSpec
from transformer.spec import ConfigError

ANCHOR = 1e11          # chosen budgets are ANCHOR · budget_ratio^j
SEARCH = range(-40, 80)  # the j tried, smallest first (1e11 · 2^-40 ≈ 1e-1 to 1e11 · 2^80 ≈ 1e35 FLOPs)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def candidate(s: SweepSpec, j: int) -> SweepSpec:
    """`s` with budgets ANCHOR · ratio^(j .. j + num_budgets − 1), 3 significant digits."""
    cs = tuple(float(f"{ANCHOR * s.budget_ratio ** (j + k):.3g}") for k in range(s.num_budgets))
    return with_budgets(s, cs)


def with_budgets(s: SweepSpec, cs: tuple[float, ...]) -> SweepSpec:
    """`s` with these budgets and validate_ratio turned into validate_flops (ratio × the largest budget) where
    validate_flops is not set."""
    validate = s.validate_flops or (float(f"{s.validate_ratio * max(cs):.3g}") if s.validate_ratio else 0.0)
    return dataclasses.replace(s, budgets=tuple(cs), validate_flops=validate, validate_ratio=0.0)


def problem(s: SweepSpec, lad: list) -> str | None:
    """Why `s`'s budgets cannot make a full IsoFLOP grid around the prior (None: they can): a budget the ladder
    cannot serve, or one that drops a size for having fewer than sweep.min_steps steps."""
    lr_of = grid.lr_rule(s)
    for budget in sorted(s.budgets):
        try:
            _, dropped = grid.budget_sizes(s, lad, budget, grid.prior_optimum(s, budget), "prior", lr_of)
        except grid.BudgetError as e:
            return str(e).removeprefix("sweep.budgets: ")
        if dropped:
            return dropped[0]
    return None


def smallest(s: SweepSpec) -> tuple[SweepSpec, tuple[float, str] | None]:
    """`s` with the smallest candidate budgets that work, and (the candidate below them, why it does not)."""
    lad = grid.ladder(s)
    tried = None
    for j in SEARCH:
        cand = candidate(s, j)
        why = problem(cand, lad)
        if why is None:
            return cand, tried
        tried = (cand.budgets[0], why)
    raise ConfigError(f"sweep.budgets is empty (the sweep chooses them), but no budget works with this ladder and "
                      f"tokenizer: {tried[1] if tried else 'no candidate'}; change sweep.d_models")


def resolve(s: SweepSpec, seconds_of: Callable[[SweepSpec], float],
            how: str = "in one process") -> tuple[SweepSpec, list[str]]:
    """(the spec with concrete budgets and validate_flops, notes saying how they were chosen and the estimated
    time). `seconds_of(spec)`: the estimated seconds of the whole sweep designed from the priors (plan.design's
    preview), stage by stage as it will train (`how` says how: estimate.Schedule); called with max_hours=0.
    Chosen budgets that exceed sweep.max_hours are tried again with fewer sizes per budget, down to
    sweep.min_sizes. ConfigError when no budget works or the plan exceeds sweep.max_hours."""
    limit = s.max_hours * 3600
    if s.budgets:
        s = with_budgets(s, s.budgets)
        if not s.max_hours:
            return s, []
        seconds, notes = seconds_of(dataclasses.replace(s, max_hours=0.0)), []
    else:
        for k in range(s.sizes_per_budget, s.min_sizes - 1, -1):
            chosen, tried = smallest(dataclasses.replace(s, sizes_per_budget=k))
            seconds = seconds_of(dataclasses.replace(chosen, max_hours=0.0))
            if not s.max_hours or seconds <= limit:
                break
        notes = [_why(chosen, tried)]
        if chosen.sizes_per_budget < s.sizes_per_budget and seconds <= limit:
            notes.append(f"sweep.sizes_per_budget lowered from {s.sizes_per_budget} to {chosen.sizes_per_budget} "
                         f"to fit sweep.max_hours={s.max_hours:g}")
        s = chosen
    if s.max_hours and seconds > limit:
        raise ConfigError(
            f"sweep.max_hours={s.max_hours:g}: the sweep (budgets {', '.join(format_flops(c) for c in s.budgets)}, "
            f"{s.sizes_per_budget} sizes each) is estimated at {_duration(seconds)} {how} (sweep.estimate_*), "
            f"over its limit of {_duration(limit)}; raise sweep.max_hours, or shrink it: fewer sweep.num_budgets, a "
            f"lower sweep.min_steps, a smaller "
            f"base.train.batch_size or data.seq_len, or a smaller vocabulary")
    notes.append(f"estimated time {_duration(seconds)} {how}"
                 + (f", within sweep.max_hours={s.max_hours:g} h" if s.max_hours else ""))
    return s, notes


def _why(s: SweepSpec, tried: tuple[float, str] | None) -> str:
    """The note that says which budgets the sweep chose and why."""
    return (f"budgets chosen by the sweep: {', '.join(format_flops(c) for c in s.budgets)} FLOPs ({s.num_budgets} "
            f"budgets {s.budget_ratio:g}× apart, the smallest of {format_flops(ANCHOR)}·{s.budget_ratio:g}^j at which "
            f"each budget's {s.sizes_per_budget} sizes all have at least sweep.min_steps={s.min_steps} steps and "
            f"straddle the prior optimum N_opt = G·C^{s.prior_exponent:g}"
            + (f"; {format_flops(tried[0])} does not: {tried[1]}" if tried else "") + ")"
            + (f"; the prediction checked at {format_flops(s.validate_flops)}" if s.validate_flops else ""))
