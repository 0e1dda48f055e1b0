"""Reproduce the published fits and backtest the loss predictions on the published data shipped in
experiments/reference_data (docs/fitting.md shows the table this prints).

  python -m experiments.reproduce [--out=FILE.json] [--extra=isoflops_openathena_nonmarin.csv] [--samples=K]

1. Chinchilla (Hoffmann et al. 2022, Epoch AI's extraction): approach 3 with the 5 highest losses dropped,
   against Epoch AI's E 1.817, α 0.348, β 0.366.
2. Porian et al. 2024's 15 settings: approach 2's exponent a against theirs.
3. Hold-out backtests on every IsoFLOP set: the largest budget with an interior minimum is predicted (its own
   minimum is the truth) from the budgets below it ("2x") and from those ≤ 1/4 of it ("4x"); coverage of the
   calibrated 95% interval, median |error| and median width, per data set.
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

from experiments import cli
from transformer.scaling import fits, isoflop, predict
from transformer.scaling import points as points_lib

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_data")
PORIAN_SETTING = ("dataset", "experiment", "hparams", "warmup", "decay", "param_count", "loss_type")
EPOCH_AI = {"E": 1.817, "alpha": 0.348, "beta": 0.366}

_OUT = flags.DEFINE_string("out", None, "Write every figure as JSON here.")
_EXTRA = flags.DEFINE_string("extra", None, "An Open-Athena-format IsoFLOP CSV whose experiments join the backtests.")
_SAMPLES = flags.DEFINE_integer("samples", 100, "Loss-noise draws per prediction.", lower_bound=2)


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
    """The largest budget with an interior minimum predicted from the budgets below it and from those ≤ 1/4."""
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
        nlo, nhi = pred.get("loss_noise_ci95") or (np.nan, np.nan)
        out.append({**rec, "predicted": pred["loss"], "ci95": [lo, hi], "error": pred["loss"] / held["loss_opt"] - 1,
                    "covered": bool(lo <= held["loss_opt"] <= hi), "width": (hi - lo) / pred["loss"],
                    "noise_covered": bool(nlo <= held["loss_opt"] <= nhi),
                    "calibrated": pred["loss_interval"]["calibrated"]})
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Per data set and case: n, covered, median |error|, median width (Markdown)."""
    lines = ["| data | case | n | 95% covers | median abs error | max abs error | median width |", "|---|---|---|---|---|---|---|"]
    for group in sorted({r["group"] for r in rows}):
        for case in ("2x", "4x"):
            sel = [r for r in rows if r["group"] == group and r["case"] == case and "error" in r]
            if sel:
                e = np.abs([r["error"] for r in sel])
                lines.append(f"| {group} | {case} | {len(sel)} | {sum(r['covered'] for r in sel)}/{len(sel)} | "
                             f"{100 * np.median(e):.2f}% | {100 * e.max():.2f}% | "
                             f"{100 * np.median([r['width'] for r in sel]):.2f}% |")
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
    rows: list[dict[str, Any]] = []
    result["porian_exponents"] = []
    for row, pts in porian_settings():
        name = f"Porian {row['dataset']}: {row['experiment']}"
        a = fits.approach2(pts)["a"]
        result["porian_exponents"].append({"setting": name, "a": a, "published": float(row["a"])})
        print(f"{name}: approach 2 a = {a:.3f} (published {float(row['a']):.3f})")
        rows += [{**r, "group": "Porian et al. 2024 (15 settings)"} for r in holdout(name, pts, _SAMPLES.value)]
    rows += [{**r, "group": "Chinchilla (Epoch AI extraction)"} for r in holdout("Chinchilla", chin, _SAMPLES.value)]
    if _EXTRA.value:
        for experiment, pts in open_athena(_EXTRA.value):
            rows += [{**r, "group": f"Open-Athena {experiment.split('__')[0]}"}
                     for r in holdout(experiment, pts, _SAMPLES.value)]
    for r in rows:
        if "error" in r:
            print(f"{r['data'][:58]:58s} {r['case']} ×{r['extrapolation']:.1f}: error {100 * r['error']:+.2f}%, "
                  f"95% [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}] {'covers' if r['covered'] else 'MISSES'} "
                  f"{r['truth']:.4f}" + ("" if r["calibrated"] else " (not calibrated)"))
    result["holdout"] = rows
    every = [{**r, "group": "all"} for r in rows]
    lines = table(rows + every)
    print("\n".join(lines))
    result["table"] = lines
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    cli.run(main)
