"""Reproduce the published fits and backtest the loss predictions on the published data shipped in
experiments/reference_data (docs/fitting.md shows the table this prints).

  python -m experiments.reproduce [--out=FILE.json] [--extra=isoflops_openathena_nonmarin.csv] [--samples=K]

1. Chinchilla (Hoffmann et al. 2022, Epoch AI's extraction): approach 3 with the 5 highest losses dropped,
   against Epoch AI's E 1.817, α 0.348, β 0.366.
2. Porian et al. 2024's 15 settings: approach 2's exponent a against theirs.
3. Leave-future-out backtests of the frontier on every IsoFLOP set (`experiments.reproduce_frontier`): fitted on the
   budgets up to each origin, every later minimum predicted; coverage of the 95% interval (the shipped
   `backtest.FRONTIER_SPREAD`, and out of sample: each source's from the other sources' pairs), median |error|,
   median width, per regime (< 4x, ≥ 4x beyond the origin) and for the older table's two cases per set; the
   spread calibrated on one family and applied to the other; the rules for E compared and chosen out of sample;
   how far the forecast at 4x the largest budget moves when one budget is dropped.
3b. The compute-optimal allocation N_opt(C) (`experiments.reproduce_allocation`): each rule of
   `experiments.allocation_rules` backtested on the same leave-future-out pairs (median |error| per regime, the
   rule chosen out of sample, the 95% intervals' coverage) and its leave-one-budget-out stability at 4x; the shipped
   N_opt / D_opt intervals before and after, checked with the observed minimum's own noise, their constant q
   calibrated out of sample, and the forms of their calibrated term compared (docs/fitting.md).
4. Hold-outs of the loss at any (N, D) (`at_points`, `experiments.reproduce_points`) on the same sets and the CPU
   over-training ladder (experiments/reference_data/overtrain_ladder_cpu.csv): refit on the model sizes ≤ N_max/2
   and ≤ N_max/4, and on the points at ≤ 10 and ≤ 40 tokens per parameter, predict every other point; coverage
   (points, sets weighted equally) with the shipped `point_interval` multipliers and out of sample (each source's
   from the other sources'), median |error| and width, per set and per regime, and the multipliers these give.
`--extra`: an Open-Athena-format CSV (columns source, experiment, params, tokens, budget, loss; not shipped here,
it has no licence: ../shared/reference-data/isoflops_openathena_nonmarin.csv) adds its experiments to 3 and 4.
"""
from __future__ import annotations

import csv
import json
import os
import sys
from typing import Any, Iterator

from absl import flags

from experiments import cli, reproduce_allocation, reproduce_frontier, reproduce_points
from transformer.scaling import fits
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


def source(experiment: str) -> str:
    """The data source of an Open-Athena experiment: its Chinchilla extractions (ml_scalefit's, Epoch AI's) are one
    source with the shipped one, Llama 3's raw and exp losses another."""
    return "Chinchilla" if "chinchilla" in experiment.lower() else experiment.split("__")[0]


def published_sets(extra: str | None) -> list[tuple[str, points_lib.Points, dict[str, str]]]:
    """The IsoFLOP sets the backtests run on, (name, points, tags: group, family, source): Porian et al.'s 15
    settings, Chinchilla, and the experiments of the Open-Athena CSV `extra` (None: none)."""
    sets = [(f"Porian {row['dataset']}: {row['experiment']}", pts, {"group": "Porian et al. 2024 (15 settings)",
             "family": "Porian", "source": f"Porian {row['dataset']}: {row['experiment']}"})
            for row, pts in porian_settings()]
    sets.append(("Chinchilla", points_lib.read_csv(os.path.join(REFERENCE, "chinchilla_hoffmann2022.csv")),
                 {"group": "Chinchilla (Epoch AI extraction)", "family": "Chinchilla", "source": "Chinchilla"}))
    if extra:
        sets += [(experiment, pts, {"group": f"Open-Athena {experiment.split('__')[0]}", "family": "Open-Athena",
                                    "source": source(experiment)}) for experiment, pts in open_athena(extra)]
    return sets


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
    sets = published_sets(_EXTRA.value)
    result["porian_exponents"] = []
    for (name, pts, _), (row, _) in zip(sets, porian_settings()):
        a = fits.approach2(pts)["a"]
        result["porian_exponents"].append({"setting": name, "a": a, "published": float(row["a"])})
        print(f"{name}: approach 2 a = {a:.3f} (published {float(row['a']):.3f})")
    result["frontier"], lines = reproduce_frontier.run(sets, _SAMPLES.value)
    print("\n".join(lines))
    result["table"] = lines
    result["allocation"], lines = reproduce_allocation.run(sets, _SAMPLES.value)
    print("\n" + "\n".join(lines))
    result["allocation_table"] = lines
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
    result["points_conditional"] = reproduce_points.conditional_table(cases)
    print("\nLoss at (N, D), hold-outs by size and by tokens per parameter:\n" + "\n".join(result["points_table"])
          + "\n\n" + "\n".join(result["points_regimes"]) + "\n\n" + "\n".join(result["points_family_split"])
          + "\n\nBy distance beyond the data and by the backtest's error:\n" + "\n".join(result["points_conditional"]))
    for direction, m in result["points_multipliers"].items():
        m_out = [c["m_out"][direction] for c in cases if "m_out" in c]
        print(f"multiplier by {direction.replace('_', ' ')} over these hold-outs: {m:.3f} (shipped "
              f"{reproduce_points.SHIPPED[direction]}); out of sample: {min(m_out):.3f}–{max(m_out):.3f}")
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    cli.run(main)
