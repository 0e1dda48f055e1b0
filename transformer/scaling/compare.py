"""A module change judged by its scaling: two IsoFLOP sweeps of one grid → the compute multiplier.

Legend: B = budgets of the grid, Q = compute values asked for (the budgets and --at_flops), K = noise
draws, G = compute values on a drawn line.

compute_multiplier(C) = C_base(L_var(C)) / C. L_var(C) = E_v + k_v·C^-γ_v is the variant's loss frontier
(`frontier.fit` through its approach-2 minima, exactly as `fits.fit_all` reports it), and
C_base(L) = (k_b / (L − E_b))^(1/γ_b) inverts the baseline's: the multiplier is how many times the compute
C the baseline needs to reach the loss the variant reaches at C. > 1: the variant is better. Where
L_var(C) ≤ E_b no baseline compute reaches it: the multiplier is infinite (null in JSON, with a note).

Intervals come from the fits' own noise model: each sweep is fitted by `fits.fit_all` with K noise draws
(its σ from seed replicates or residuals, the losses redrawn with every design point kept, the frontier
refitted per draw); draw k of the baseline's frontier is paired with draw k of the variant's (independent
noise: the two fits get different seeds) and the 95% interval is the 2.5th–97.5th percentile of the K
multipliers, an end being infinite where the variant's loss falls below the baseline's E in that many draws.

Before any fitting, both directories must be IsoFLOP sweep directories (sweep.json), of the same grid
(budgets and, per budget, model shapes d_model × num_layers: the FFN width or the parameter count may
differ, as a matched-parameter variant needs) and finished (an ok row in results.jsonl for every run).
"""
from __future__ import annotations

import collections
import json
import math
import os
from typing import Any

import numpy as np

from transformer.spec import ConfigError, MissingInputError
from transformer.scaling import fits, frontier, interval, verdict
from transformer.scaling import points as points_lib

AT_FLOPS_FACTOR = 4.0  # --at_flops defaults to this many times the largest budget
ROLES = ("baseline", "variant")
DEFINITION = ("compute_multiplier(C) = C_base(L_var(C)) / C: how many times the compute C the baseline needs "
              "to reach the variant's compute-optimal loss L_var(C) (both from their frontiers "
              "L_opt(C) = E + k·C^-gamma); > 1: the variant is better; null: infinite (L_var(C) is below the "
              "baseline's irreducible E)")


# ---------------------------------------------------------------- the sweeps: grid and completeness


def read_grid(directory: str, flag: str) -> dict[str, Any]:
    """The grid of a sweep directory's sweep.json: {"name", "runs": [run_id], "sizes": {budget: [shape]}}
    (shapes "d<d_model>-L<num_layers>" of the runs with role "grid", sorted; budgets increasing; "runs" lists
    every run, all of which must be finished). ConfigError when it is not an IsoFLOP
    sweep directory."""
    if not os.path.isdir(directory):
        raise MissingInputError(f"{flag}={directory}: no such directory; give a sweep directory (the --workdir "
                                "of experiments.sweep)")
    path = os.path.join(directory, "sweep.json")
    if not os.path.isfile(path):
        raise MissingInputError(f"{flag}={directory} is not a sweep directory: it has no sweep.json (the "
                                "--workdir of experiments.sweep holds sweep.json, results.jsonl and runs/)")
    try:
        with open(path) as f:
            doc = json.load(f)
    except ValueError as e:
        raise ConfigError(f"{flag}={directory}: sweep.json is not valid JSON ({e})") from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list) or not runs:
        raise ConfigError(f"{flag}={directory}: sweep.json lists no runs; it is not a sweep's plan")
    if doc.get("mode") != "isoflop":
        raise ConfigError(f"{flag}={directory} is a sweep.mode={doc.get('mode')!r} sweep; compare needs two "
                          "IsoFLOP sweeps (sweep.mode='isoflop')")
    sizes: dict[float, list[str]] = collections.defaultdict(list)
    for run in runs:
        if run.get("role", "grid") != "grid":  # LR calibration, schedule check and validation runs: each sweep's own
            continue
        if not all(isinstance(run.get(k), (int, float)) for k in ("budget", "d_model", "num_layers")):
            raise ConfigError(f"{flag}={directory}: run {run.get('run_id')!r} of sweep.json lacks its budget, "
                              "d_model or num_layers")
        sizes[float(run["budget"])].append(f"d{int(run['d_model'])}-L{int(run['num_layers'])}")
    return {"name": doc.get("name", ""), "runs": [str(r["run_id"]) for r in runs],
            "sizes": {b: sorted(sizes[b]) for b in sorted(sizes)}}


def _fmt(c: float) -> str:
    return f"{c:.3g}"


def _names(count: collections.Counter) -> str:
    """"d16-L1, d32-L1 (x3)": shapes with their repeat counts (seed replicates) where above 1."""
    order = sorted(count, key=lambda name: [int(x) for x in name[1:].split("-L")])
    return ", ".join(name + (f" (x{count[name]})" if count[name] > 1 else "") for name in order)


def grid_differences(base: dict[str, Any], var: dict[str, Any]) -> list[str]:
    """What differs between two grids: budgets only in one, and per shared budget the shapes only in one."""
    diffs = []
    for a, b, name in ((base, var, "baseline"), (var, base, "variant")):
        only = [c for c in a["sizes"] if c not in b["sizes"]]
        if only:
            diffs.append(f"budgets only in the {name}: {', '.join(map(_fmt, only))}")
    for c in (c for c in base["sizes"] if c in var["sizes"]):
        count_b, count_v = collections.Counter(base["sizes"][c]), collections.Counter(var["sizes"][c])
        only_b, only_v = _names(count_b - count_v), _names(count_v - count_b)
        if only_b or only_v:
            diffs.append(f"budget {_fmt(c)}: sizes only in the baseline: {only_b or 'none'}; only in "
                         f"the variant: {only_v or 'none'}")
    return diffs


def _recorded(directory: str) -> dict[str, dict[str, Any]]:
    """{run_id: its last row} of DIR/results.jsonl (lines that are not JSON objects, torn writes, skipped)."""
    rows: dict[str, dict[str, Any]] = {}
    path = os.path.join(directory, "results.jsonl")
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and "run_id" in row:
                    rows[str(row["run_id"])] = row
    return rows


def unfinished(directory: str, grid: dict[str, Any], flag: str) -> str | None:
    """None when every run of sweep.json has a row that is not FAILED (scaling/verdict.py: ok, or diverged, which
    the fit leaves out); else what is missing and the commands that finish it."""
    rows = _recorded(directory)
    missing = [i for i, rid in enumerate(grid["runs"]) if rid not in rows]
    # a diverged run is finished (an observation the fit leaves out, which --retry_failed does not train again)
    failed = [rid for rid in grid["runs"] if rid in rows and verdict.verdict(rows[rid])[0] == verdict.FAILED]
    if not missing and not failed:
        return None
    total = len(grid["runs"])
    parts = [f"{flag}={directory} is an unfinished sweep: {len(missing) + len(failed)} of {total} runs have no "
             "'ok' row in results.jsonl"
             + (f" ({len(missing)} not recorded yet, {len(failed)} failed)" if missing and failed else
                " (not recorded yet)" if missing else " (failed)")]
    config = f"CONFIG (the sweep config it was started with, sweep '{grid['name']}', and its --config.* overrides)"
    if missing:
        indices = ",".join(map(str, missing[:12])) + (",..." if len(missing) > 12 else "")
        parts.append(f"finish it with `python -m experiments.sweep --config={config} --workdir={directory}` "
                     f"(it resumes where it stopped), or run by run with `python -m experiments.sweep "
                     f"--workdir={directory} --run_index=I` for I in {indices}")
    if failed:
        parts.append(f"rerun the failed ones with `python -m experiments.sweep --config={config} "
                     f"--workdir={directory} --retry_failed` (e.g. {failed[0]})")
    return "; ".join(parts)


# ---------------------------------------------------------------- the multiplier and its draws


def multiplier(law_base: dict[str, Any], loss: np.ndarray, flops: np.ndarray) -> np.ndarray:
    """C_base(loss) / C, C_base the inverse of the baseline's frontier (`frontier.loss_at`); inf where loss is at or
    below its asymptote. A single law inverts in closed form, C_base(L) = (k_b / (L − E_b))^(1/γ_b); the soft
    test's mixture of two laws by bisection in ln C (it falls with C). `law_base` holds floats or arrays
    broadcasting against `loss` and `flops` (draws (K, 1) against compute values (Q,))."""
    gap = np.asarray(loss, float) - np.asarray(frontier.asymptote(law_base), float)
    if "weight_held" in law_base:
        log_c = _inverse_log_flops(law_base, np.broadcast_to(np.asarray(loss, float), gap.shape))
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(gap > 0, np.exp(log_c - np.log(flops)), np.inf)
    e, k, gamma = (np.asarray(law_base[key], float) for key in ("E", "k", "gamma"))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_ratio = (np.log(k) - np.log(np.where(gap > 0, gap, 1.0))) / gamma - np.log(flops)
        return np.where(gap > 0, np.exp(log_ratio), np.inf)


def _inverse_log_flops(law: dict[str, Any], loss: np.ndarray, lo: float = -50.0, hi: float = 250.0,
                       steps: int = 80) -> np.ndarray:
    """ln C where `frontier.loss_at(law, C)` = `loss`, by bisection over [lo, hi] in ln C (to (hi − lo)·2^−steps);
    at the bracket's end where the loss lies outside it. Shapes as `multiplier`'s."""
    lo_, hi_ = np.full(loss.shape, lo), np.full(loss.shape, hi)
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(steps):
            mid = (lo_ + hi_) / 2
            above = frontier.loss_at(law, np.exp(mid)) > loss  # still above the target: more compute
            lo_, hi_ = np.where(above, mid, lo_), np.where(above, hi_, mid)
    return (lo_ + hi_) / 2


def law_draws(fit: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """The frontier's noise draws in fit.json (`frontier.draw_arrays`), or None."""
    return frontier.draw_arrays(fit["frontier"].get("bootstrap", {}).get("draws"))


def at_compute(flops_Q: np.ndarray, laws: dict[str, dict | None], draws: dict[str, dict | None],
               source: str = "none") -> list[dict]:
    """Per compute value: the multiplier with its interval, both frontiers' losses and their difference; the
    intervals' noise `source` is the two fits' (`interval.SOURCES`, "+"-joined where they differ)."""
    base, var = laws["baseline"], laws["variant"]
    out = [{"flops": float(c)} for c in flops_Q]
    if base is None or var is None:
        missing = " and ".join(r for r in ROLES if laws[r] is None)
        for rec in out:
            rec.update(compute_multiplier=None, note=f"no frontier for the {missing} (see fits.*.frontier.note)")
        return out
    loss_b_Q, loss_v_Q = frontier.loss_at(base, flops_Q), frontier.loss_at(var, flops_Q)
    m_Q = multiplier(base, loss_v_Q, flops_Q)
    paired = draws["baseline"] is not None and draws["variant"] is not None
    if paired:
        db, dv = draws["baseline"], draws["variant"]
        ok_K = np.all([np.isfinite(d[k]) for d in (db, dv) for k in ("E", "k", "gamma")], axis=0)
        col = {role: {k: d[k][ok_K][:, None] for k in d} for role, d in (("baseline", db), ("variant", dv))}
        lv_KQ = frontier.loss_at(col["variant"], flops_Q)
        lb_KQ = frontier.loss_at(col["baseline"], flops_Q)
        m_KQ = multiplier(col["baseline"], lv_KQ, flops_Q)
    for q, rec in enumerate(out):
        rec.update(compute_multiplier=float(m_Q[q]) if np.isfinite(m_Q[q]) else None,
                   loss_baseline=float(loss_b_Q[q]), loss_variant=float(loss_v_Q[q]),
                   loss_difference=float(loss_v_Q[q] - loss_b_Q[q]))
        notes = []
        if np.isinf(m_Q[q]):
            notes.append(f"infinite: the variant's L_opt = {loss_v_Q[q]:.4f} is below the baseline's irreducible "
                         f"loss E = {float(frontier.asymptote(base)):.4f}; no baseline compute reaches it")
        if paired:
            ci = interval.from_draws(m_KQ[:, q], source, keep_infinite=True)
            difference = interval.from_draws(lv_KQ[:, q] - lb_KQ[:, q], source, keep_infinite=True)
            infinite = float(np.mean(np.isinf(m_KQ[:, q])))
            rec.update(ci.fields("compute_multiplier") if ci else {"compute_multiplier_ci95": None})
            rec.update(variant_better_fraction=float(np.mean(m_KQ[:, q] > 1.0)), draws=int(ok_K.sum()))
            rec.update(difference.fields("loss_difference") if difference else {"loss_difference_ci95": None})
            if ci is not None and math.isinf(ci.hi):
                notes.append(f"the interval's upper end is infinite: in {100 * infinite:.1f}% of the draws the "
                             "variant's loss is below the baseline's E")
        if notes:
            rec["note"] = "; ".join(notes)
    return out


# ---------------------------------------------------------------- the comparison


def _budget_record(fit: dict[str, Any], c: float) -> dict[str, Any]:
    """A sweep's measured numbers at grid budget c: its approach-2 minimum (or why there is none) and
    its lowest loss."""
    a2 = fit["approach2"]
    candidates = a2.get("budgets", []) + a2.get("budgets_excluded", [])
    budget = min(candidates, key=lambda b: abs(math.log(b["flops"] / c)))
    rec: dict[str, Any] = {"lowest_loss": float(min(budget["loss"]))}
    if "loss_opt" in budget:
        rec.update(loss_opt=budget["loss_opt"], N_opt=budget["N_opt"], D_opt=budget["D_opt"], C_opt=budget["C_opt"])
    else:
        rec.update(loss_opt=None, reason=budget["reason"])
    return rec


def fit_summary(fit: dict[str, Any]) -> dict[str, Any]:
    """What compare.json keeps of one sweep's fit: σ, approach 2's a and b with intervals and its
    budgets, the frontier with its intervals and its draws (for the figure)."""
    a2, front = fit["approach2"], fit["frontier"]
    keys2 = ("a", "a_ci95", "b", "b_ci95", "ci95_source", "N_coef", "D_coef", "method", "note")
    draws = front.get("bootstrap", {}).get("draws")
    return {
        "source": fit["source"], "headline": fit["headline"]["convention"], "noise": fit["noise"],
        "approach2": {**{k: a2[k] for k in keys2 if k in a2},
                      "budgets": [{k: b[k] for k in ("flops", "C_opt", "N_opt", "D_opt", "loss_opt")}
                                  for b in a2.get("budgets", [])],
                      "budgets_excluded": [{"flops": b["flops"], "reason": b["reason"]}
                                           for b in a2.get("budgets_excluded", [])]},
        "frontier": {**{k: front[k] for k in ("form", "law", "E_from", "test", "E_ci95", "gamma_ci95", "ci95_source", "note")
                        if k in front},
                     **({"draws": {k: [x if x is not None and math.isfinite(x) else None for x in v]
                                   for k, v in draws.items()}} if draws else {})},
    }


def compare(baseline: str, variant: str, *, at_flops: float | None = None, bootstrap: int = 200,
            seed: int = 0) -> dict[str, Any]:
    """The compare.json content for two sweep directories (see the module docstring). Every input check
    (sweep directories, one grid, finished, options) happens before any fitting."""
    if bootstrap < 0:
        raise ConfigError(f"bootstrap={bootstrap} is not valid; choose 0 (no intervals) or a positive draw count")
    if at_flops is not None and not (math.isfinite(at_flops) and at_flops > 0):
        raise ConfigError(f"at_flops={at_flops} is not valid; give a positive FLOP count, e.g. 1e14")
    dirs = {"baseline": baseline, "variant": variant}
    grids = {role: read_grid(d, f"--{role}") for role, d in dirs.items()}
    diffs = grid_differences(grids["baseline"], grids["variant"])
    if diffs:
        raise ConfigError(f"--baseline={baseline} and --variant={variant} are not sweeps of the same grid: "
                          + "; ".join(diffs) + ". Run the variant with the baseline's sweep config (budgets, "
                          "d_models, ladder rules), changing only the module under test")
    problems = [p for role, d in dirs.items() if (p := unfinished(d, grids[role], f"--{role}"))]
    if problems:
        raise ConfigError(" | ".join(problems))
    budgets_B = np.array(list(grids["baseline"]["sizes"]), float)
    at = float(at_flops) if at_flops is not None else AT_FLOPS_FACTOR * float(budgets_B.max())
    fitted = {role: fits.fit_all(points_lib.read_sweep(d), bootstrap=bootstrap, seed=2 * seed + i)
              for i, (role, d) in enumerate(dirs.items())}
    laws = {role: f["frontier"].get("law") for role, f in fitted.items()}
    draws = {role: law_draws(f) for role, f in fitted.items()}
    source = "+".join(sorted({interval.noise_kind(f["noise"]) for f in fitted.values()}))
    records = at_compute(np.append(budgets_B, at), laws, draws, source)
    for rec, c in zip(records, budgets_B):
        measured = {role: _budget_record(fitted[role], c) for role in ROLES}
        rec["measured"] = measured
        both = measured["baseline"]["loss_opt"] is not None and measured["variant"]["loss_opt"] is not None
        rec["minima_difference"] = (measured["variant"]["loss_opt"] - measured["baseline"]["loss_opt"]
                                    if both else None)
    extrapolated = {**records[-1], "at_flops_from": "--at_flops" if at_flops is not None else
                    f"default: {AT_FLOPS_FACTOR:g}x the largest budget", "beyond_largest_budget": at / budgets_B.max()}
    notes = [f"{role}: {f['noise']['source']}: no intervals" for role, f in fitted.items() if not f["noise"]["sigma"]]
    return {
        "baseline": baseline, "variant": variant, "definition": DEFINITION,
        "options": {"bootstrap": bootstrap, "seed": seed, "at_flops": at,
                    "seeds_of_the_fits": {role: 2 * seed + i for i, role in enumerate(ROLES)}},
        "grid": {"budgets": budgets_B.tolist(), "sizes": {_fmt(c): s for c, s in grids["baseline"]["sizes"].items()}},
        "fits": {role: fit_summary(f) for role, f in fitted.items()},
        "budgets": records[:-1], "extrapolated": extrapolated, "notes": notes,
    }


# ---------------------------------------------------------------- for people


def _interval(ci: list[float | None] | None, fmt: str) -> str:
    if not ci:
        return ""
    return " [" + ", ".join("inf" if x is None else f"{x:{fmt}}" for x in ci) + "]"


def _multiplier_line(rec: dict[str, Any]) -> str:
    m = rec.get("compute_multiplier")
    text = f"{m:.3g}x" if m is not None else ("inf" if "infinite" in rec.get("note", "") else "n/a")
    text += _interval(rec.get("compute_multiplier_ci95"), ".3g")
    if rec.get("loss_difference") is not None:
        text += (f"   loss variant - baseline {rec['loss_difference']:+.4f}"
                 + _interval(rec.get("loss_difference_ci95"), "+.4f"))
    if "variant_better_fraction" in rec:
        text += f"   variant better in {100 * rec['variant_better_fraction']:.0f}% of draws"
    return text


def summary(result: dict[str, Any]) -> str:
    """A few lines: both fits' exponents and frontiers, the multiplier per budget and extrapolated."""
    lines = []
    for role in ROLES:
        f = result["fits"][role]
        a2, law = f["approach2"], f["frontier"].get("law")
        exps = (f"a = {a2['a']:.3f}{_interval(a2.get('a_ci95'), '.3f')}  b = {a2['b']:.3f}"
                f"{_interval(a2.get('b_ci95'), '.3f')}" if a2.get("a") is not None else f"approach 2: {a2.get('note')}")
        front = (f"L_opt(C) = {law['E']:.3f} + {law['k']:.4g}·C^-{law['gamma']:.3f}" if law
                 else f"no frontier: {f['frontier'].get('note')}")
        lines.append(f"{role:8s} {result[role]}: {exps}; {front}")
    lines.append("compute multiplier C_base(L_var(C)) / C (> 1: the variant is better), 95% intervals:")
    for rec in result["budgets"]:
        lines.append(f"  C = {rec['flops']:.3g}: {_multiplier_line(rec)}")
    ext = result["extrapolated"]
    lines.append(f"  C = {ext['flops']:.3g} ({ext['at_flops_from']}): {_multiplier_line(ext)}")
    for rec in [*result["budgets"], ext]:
        if rec.get("note"):
            lines.append(f"note at C = {rec['flops']:.3g}: {rec['note']}")
    lines.extend(f"note: {n}" for n in result["notes"])
    return "\n".join(lines)
