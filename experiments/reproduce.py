"""Reproduce the published fits and backtest the loss predictions on the published data shipped in
experiments/reference_data (docs/fitting.md shows the table this prints).

  python -m experiments.reproduce [--out=FILE.json] [--extra=isoflops_openathena_nonmarin.csv] [--samples=K]

1. Chinchilla (Hoffmann et al. 2022, Epoch AI's extraction): approach 3 with the 5 highest losses dropped,
   against Epoch AI's E 1.817, α 0.348, β 0.366.
2. Porian et al. 2024's 15 settings: approach 2's exponent a against theirs.
3. Hold-out backtests on every IsoFLOP set: the largest budget with an interior minimum is predicted (its own
   minimum is the truth) from the budgets below it ("2x") and from those ≤ 1/4 of it ("4x"); coverage of the
   calibrated 95% interval, median |error| and median width, per data set: with m = 1 (the intervals before the
   conformal multiplier), with the shipped m (`backtest.INTERVAL_SCALE`, calibrated on these hold-outs: in
   sample), and out of sample (each data source's m calibrated on the other sources' hold-outs,
   `backtest.leave_group_out`); and the conformal m these hold-outs give.
4. Hold-outs of the loss at any (N, D) (`at_points`, `experiments.reproduce_points`) on the same sets and the CPU
   over-training ladder (experiments/reference_data/overtrain_ladder_cpu.csv): refit on the model sizes ≤ N_max/2
   and ≤ N_max/4, and on the points at ≤ 10 and ≤ 40 tokens per parameter, predict every other point; coverage
   (points, sets weighted equally) with the shipped `point_interval` multipliers and out of sample (each source's
   from the other sources'), median |error| and width, per set and per regime, and the multipliers these give.
`--extra`: an Open-Athena-format CSV (columns source, experiment, params, tokens, budget, loss; not shipped here,
it has no licence: ../shared/reference-data/isoflops_openathena_nonmarin.csv) adds its experiments to 3.
"""
from __future__ import annotations

import csv
import json
import os
import sys
from typing import Any, Iterator

import numpy as np
from absl import flags

from experiments import cli, reproduce_points
from transformer.scaling import backtest, fits, isoflop, predict
from transformer.scaling import points as points_lib

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_data")
LADDER = os.path.join(REFERENCE, "overtrain_ladder_cpu.csv")
PORIAN_SETTING = ("dataset", "experiment", "hparams", "warmup", "decay", "param_count", "loss_type")
EPOCH_AI = {"E": 1.817, "alpha": 0.348, "beta": 0.366}

_OUT = flags.DEFINE_string("out", None, "Write every figure as JSON here.")
_EXTRA = flags.DEFINE_string("extra", None, "An Open-Athena-format IsoFLOP CSV whose experiments join the backtests.")
_SAMPLES = flags.DEFINE_integer("samples", 100, "Loss-noise draws per prediction.", lower_bound=2)


def ladder() -> points_lib.Points:
    """The CPU over-training ladder (`experiments.overtrain_ladder`): N the total parameters, C = 6·N·D."""
    with open(LADDER, newline="") as f:
        rows = list(csv.DictReader(f))
    return points_lib.from_arrays([float(r["params"]) for r in rows], [float(r["tokens"]) for r in rows],
                                  [float(r["loss"]) for r in rows], ids=[f"{r['size']}@{r['tokens_per_param']}"
                                                                         for r in rows], source=LADDER)


def porian_settings() -> Iterator[tuple[dict[str, str], points_lib.Points]]:
    with open(os.path.join(REFERENCE, "porian2024_exponents.csv")) as f:
        for row in csv.DictReader(f):
            yield row, points_lib.read_csv(os.path.join(REFERENCE, "porian2024_isoflop_points.csv"),
                                           where={k: row[k] for k in PORIAN_SETTING})


def open_athena(path: str) -> Iterator[tuple[str, points_lib.Points]]:
    """Each experiment of an Open-Athena IsoFLOP CSV as points (C = its snapped budget)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for experiment in dict.fromkeys(r["experiment"] for r in rows):
        sel = [r for r in rows if r["experiment"] == experiment]
        yield experiment, points_lib.from_arrays(
            [float(r["params"]) for r in sel], [float(r["tokens"]) for r in sel], [float(r["loss"]) for r in sel],
            flops=[float(r["budget"]) for r in sel], ids=[f"{experiment}:{i}" for i in range(len(sel))],
            source=f"{path} [{experiment}]")


def holdout(name: str, pts: points_lib.Points, samples: int) -> list[dict[str, Any]]:
    """The largest budget with an interior minimum predicted from the budgets below it and from those ≤ 1/4;
    `score` = |ln(L̂ / L)| / (t·σ), the error in units of the interval's half-width at multiplier 1."""
    held = max(isoflop.approach2(pts)["budgets"], key=lambda b: b["flops"])
    out = []
    for label, keep_P in (("2x", pts.flops_P < held["flops"] / 1.0001),
                          ("4x", pts.flops_P <= held["flops"] / 4 * 1.0001)):
        pred = predict.frontier_predictions(pts.subset(keep_P), [held["flops"]], samples)["predictions"][0]
        rec: dict[str, Any] = {"data": name, "case": label, "truth": held["loss_opt"],
                               "extrapolation": float(held["flops"] / pts.flops_P[keep_P].max())}
        if pred.get("loss") is None or not pred.get("loss_ci95"):
            out.append({**rec, "note": pred.get("note", "no interval")})
            continue
        lo, hi = pred["loss_ci95"]
        cal = pred["loss_interval"]
        nlo, nhi = pred.get("loss_noise_ci95") or (np.nan, np.nan)
        out.append({**rec, "predicted": pred["loss"], "ci95": [lo, hi], "error": pred["loss"] / held["loss_opt"] - 1,
                    "covered": bool(lo <= held["loss_opt"] <= hi), "width": (hi - lo) / pred["loss"],
                    "noise_covered": bool(nlo <= held["loss_opt"] <= nhi), "unit": cal["t"] * cal["sigma_log"],
                    "score": abs(np.log(pred["loss"] / held["loss_opt"])) / (cal["t"] * cal["sigma_log"]),
                    "calibrated": pred["loss_interval"]["calibrated"]})
    return out


def source(experiment: str) -> str:
    """The data source of an Open-Athena experiment: its Chinchilla extractions (ml_scalefit's, Epoch AI's) are one
    source with the shipped one, Llama 3's raw and exp losses another."""
    return "Chinchilla" if "chinchilla" in experiment.lower() else experiment.split("__")[0]


def calibrate(rows: list[dict[str, Any]]) -> float:
    """Adds to each hold-out with an interval its out-of-sample multiplier `m_out` (calibrated on the other data
    sources, `backtest.leave_group_out`), `covered_out`, `width_out`, and `width_m1` / `covered_m1` at m = 1;
    returns the conformal m over every hold-out (what `backtest.INTERVAL_SCALE` rounds up)."""
    sel = [r for r in rows if "score" in r]
    for r, m in zip(sel, backtest.leave_group_out([r["score"] for r in sel], [r["source"] for r in sel])):
        r["m_out"] = m
        for key, mult in (("_out", m), ("_m1", 1.0)):
            r["covered" + key], r["width" + key] = backtest.at_multiplier(r["score"], r["unit"], mult)
    return backtest.conformal_multiplier([r["score"] for r in sel])


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Per data set and case: n, covered and median width at m = 1 → the shipped m → out of sample, median and max
    |error| (Markdown)."""
    lines = ["| data | case | n | 95% covers: m = 1 → shipped m → out of sample | median abs error | max abs error "
             "| median width: m = 1 → shipped m → out of sample |", "|---|---|---|---|---|---|---|"]
    for group in dict.fromkeys(r["group"] for r in rows):
        for case in ("2x", "4x"):
            sel = [r for r in rows if r["group"] == group and r["case"] == case and "error" in r]
            if sel:
                e, n = np.abs([r["error"] for r in sel]), len(sel)
                cover = " → ".join(f"{sum(r[k] for r in sel)}/{n}" for k in ("covered_m1", "covered", "covered_out"))
                width = " → ".join(f"{100 * np.median([r[k] for r in sel]):.2f}%" for k in ("width_m1", "width", "width_out"))
                lines.append(f"| {group} | {case} | {n} | {cover} | {100 * np.median(e):.2f}% | {100 * e.max():.2f}% "
                             f"| {width} |")
    return lines


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        print(f"reproduce: error: unexpected arguments {' '.join(argv[1:])!r}", file=sys.stderr)
        sys.exit(2)
    result: dict[str, Any] = {}
    chin = points_lib.read_csv(os.path.join(REFERENCE, "chinchilla_hoffmann2022.csv"))
    a3 = fits.approach3(fits.drop_highest_loss(chin, 5))
    result["chinchilla_approach3"] = {k: a3[k] for k in ("E", "alpha", "beta", "a")}
    print("Chinchilla approach 3 (5 highest losses dropped): "
          + ", ".join(f"{k} {a3[k]:.3f} (Epoch AI {v})" for k, v in EPOCH_AI.items()))
    sets: list[tuple[str, points_lib.Points, dict[str, str]]] = []
    result["porian_exponents"] = []
    for row, pts in porian_settings():
        name = f"Porian {row['dataset']}: {row['experiment']}"
        a = fits.approach2(pts)["a"]
        result["porian_exponents"].append({"setting": name, "a": a, "published": float(row["a"])})
        print(f"{name}: approach 2 a = {a:.3f} (published {float(row['a']):.3f})")
        sets.append((name, pts, {"group": "Porian et al. 2024 (15 settings)", "family": "Porian", "source": name}))
    sets.append(("Chinchilla", chin, {"group": "Chinchilla (Epoch AI extraction)", "family": "Chinchilla",
                                      "source": "Chinchilla"}))
    if _EXTRA.value:
        sets += [(experiment, pts, {"group": f"Open-Athena {experiment.split('__')[0]}", "family": "Open-Athena",
                                    "source": source(experiment)}) for experiment, pts in open_athena(_EXTRA.value)]
    rows = [{**r, **tags} for name, pts, tags in sets for r in holdout(name, pts, _SAMPLES.value)]
    result["conformal_multiplier"] = calibrate(rows)
    for r in rows:
        if "error" in r:
            print(f"{r['data'][:58]:58s} {r['case']} ×{r['extrapolation']:.1f}: error {100 * r['error']:+.2f}%, "
                  f"95% [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}] {'covers' if r['covered'] else 'MISSES'} "
                  f"{r['truth']:.4f}" + ("" if r["calibrated"] else " (not calibrated)"))
    result["holdout"] = rows
    families = [{**r, "group": f"family: {r['family']}"} for r in rows if r["family"] == "Open-Athena"]
    lines = table(rows + families + [{**r, "group": "all"} for r in rows])
    print("\n".join(lines))
    print(f"conformal multiplier over these hold-outs: {result['conformal_multiplier']:.3f} "
          f"(shipped backtest.INTERVAL_SCALE {backtest.INTERVAL_SCALE}); out of sample, each source's from the others: "
          f"{min(r['m_out'] for r in rows if 'm_out' in r):.3f}–{max(r['m_out'] for r in rows if 'm_out' in r):.3f}")
    result["table"] = lines
    ladder_sets = [("CPU over-training ladder", ladder(), {"group": "CPU over-training ladder (shipped)",
                                                           "family": "ladder", "source": "ladder"})]
    cases = [{**c, **tags} for name, pts, tags in sets + ladder_sets for c in reproduce_points.holdout(name, pts)]
    result["points_multipliers"] = reproduce_points.calibrate(cases)
    result["points_holdout"] = cases
    result["points_table"] = reproduce_points.table(
        cases + [{**c, "group": f"family: {c['family']}"} for c in cases if c["family"] == "Open-Athena"]
        + [{**c, "group": "all"} for c in cases])
    result["points_regimes"] = reproduce_points.regime_table(cases)
    result["points_family_split"] = reproduce_points.family_split(cases)
    print("\nLoss at (N, D), hold-outs by size and by tokens per parameter:\n" + "\n".join(result["points_table"])
          + "\n\n" + "\n".join(result["points_regimes"]) + "\n\n" + "\n".join(result["points_family_split"]))
    for direction, m in result["points_multipliers"].items():
        m_out = [c["m_out"][direction] for c in cases if "m_out" in c]
        print(f"multiplier by {direction.replace('_', ' ')} over these hold-outs: {m:.3f} (shipped "
              f"{reproduce_points.SHIPPED[direction]}); out of sample: {min(m_out):.3f}–{max(m_out):.3f}")
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    cli.run(main)
