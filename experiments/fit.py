"""Fit compute-optimal scaling laws (Chinchilla Approaches 1–3) to a sweep or a CSV of points.

  python -m experiments.fit (--sweep=DIR | --points=FILE.csv [--where=COLUMN=VALUE ...] [--columns=NAME=COLUMN,...])
      --out=OUT \
      [--predict_flops=C[,C2,...]] [--bootstrap=K] [--seed=S] [--headline=CONVENTION]
      [--isoflop_method=akima|parabola] [--isoflop_window=W] [--approach3_near=F] [--drop_highest=K]
      [--n_kind=params|params_non_embedding] [--predict_points=N:D[,N:D...] | --predict_points_csv=FILE]
      [--metric=eval_loss|eval_bits_per_byte|eval/NAME/bits_per_byte|tasks/NAME/bits_per_byte]  (--sweep only)
      [--accuracy_metric=tasks/NAME/acc]  (with --metric: the two-step law, transformer/scaling/two_step.py)

Writes OUT/fit.json and OUT/*.png and prints a short summary, with the frontier's backtest (fit.json["frontier"]
["backtest"]) and the predictions' calibrated intervals (docs/fitting.md). Example, one setting of Porian et al.'s
points: --points=experiments/reference_data/porian2024_isoflop_points.csv --where=dataset=RefinedWeb
--where="experiment=Cosine decay".
"""
from __future__ import annotations

import os
import sys

from absl import flags

from experiments import cli
from experiments._paths import DEFINE_path
from transformer.spec import ConfigError

from transformer.files import write_json
from transformer.scaling import at_points, conventions, csv_checks, fits, isoflop, report, two_step
from transformer.scaling import points as points_lib

_SWEEP = DEFINE_path("sweep", None, "Sweep directory holding results.jsonl (and runs/*/metrics.jsonl).")
_POINTS = DEFINE_path("points", None, "CSV with a header naming params (or N), tokens (or D), loss "
                              "(optional flops: each run's budget; without it C = 6·N·D; with it, one of params "
                              "and tokens may be absent: C / (6·the other)).")
_COLUMNS = flags.DEFINE_list("columns", [], "NAME=COLUMN[,...]: the CSV columns that hold params, tokens, flops "
                             "and loss where the header names them otherwise, e.g. params=parameter_count,"
                             "tokens=train_tokens.")
_WHERE = flags.DEFINE_multi_string("where", [], "COLUMN=VALUE: keep the CSV rows of one setting (repeatable).")
_PREDICT = flags.DEFINE_list("predict_flops", [], "Budgets C to predict N_opt, D_opt and the optimal loss at "
                             "(with 95% intervals), into fit.json['predictions'].")
_PREDICT_POINTS = flags.DEFINE_list("predict_points", [], "N:D pairs whose loss approach 3 or Gadre et al.'s "
                                    "over-training form predicts (whichever wins a backtest by model size; with "
                                    "calibrated 95% intervals), into fit.json['point_predictions'].")
_PREDICT_POINTS_CSV = flags.DEFINE_string("predict_points_csv", None, "A CSV with params (or N) and tokens (or D) "
                                          "columns: the (N, D) pairs to predict, as --predict_points.")
_HEADLINE = flags.DEFINE_enum("headline", None, list(conventions.DESCRIPTIONS),
                              "The N/C convention of the main fit (default: eff where the points have it).")
_METHOD = flags.DEFINE_enum("isoflop_method", None, list(isoflop.METHODS),
                            "Approach 2's per-budget minimum (default akima; parabola when --isoflop_window).")
_NEAR = flags.DEFINE_float("approach3_near", fits.APPROACH3_NEAR, "Approach 3 fits points within this "
                           "factor in N of their budget's optimum (0: all points).", lower_bound=0.0)
_OUT = DEFINE_path("out", None, "Output directory for fit.json and the figures.")
_ACCURACY = flags.DEFINE_string("accuracy_metric", None, "With --metric=tasks/NAME/bits_per_byte: the two-step law "
                                "to this accuracy (e.g. tasks/NAME/acc), a sigmoid of the fitted metric "
                                "(fit.json's two_step; predictions at --predict_flops).")
_METRIC = flags.DEFINE_string("metric", "eval_loss", "What a sweep's fit fits as the loss: eval_loss, "
                              "eval_bits_per_byte, a named set's eval/NAME/bits_per_byte (data.eval_sets) or a task's "
                              "tasks/NAME/bits_per_byte (train.eval_tasks).")
_DROP_HIGHEST = flags.DEFINE_integer("drop_highest", 0, "Leave out the K highest-loss points.", lower_bound=0)
_BOOTSTRAP = flags.DEFINE_integer("bootstrap", 200, "Loss-noise draws for 95% intervals (0: none).",
                                  lower_bound=0)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the noise draws.")
_N_KIND = flags.DEFINE_enum("n_kind", "params", points_lib.N_KINDS, "Which parameter count a sweep's points "
                            "load as params; the fit's N is --headline's, every convention is reported.")
_ISOFLOP_WINDOW = flags.DEFINE_integer(
    "isoflop_window", None,
    "Approach 2 with --isoflop_method=parabola: fit each parabola to the lowest-loss size and this many "
    "neighbours per side (unset: all sizes of the budget).", lower_bound=1)


def _fail(message: str) -> None:
    print(f"fit: error: {message}", file=sys.stderr)
    sys.exit(2)


def _predict_flops() -> list[float]:
    values = []
    for text in _PREDICT.value:
        try:
            values.append(float(text))
        except ValueError:
            raise ConfigError(f"--predict_flops: {text!r} is not a number; give FLOP counts, e.g. 4e13,1e14") from None
    return values


def _predict_points() -> list[tuple[float, float]]:
    pairs = at_points.parse(_PREDICT_POINTS.value)
    texts = []
    if _PREDICT_POINTS_CSV.value:
        if not os.path.isfile(_PREDICT_POINTS_CSV.value):
            raise ConfigError(f"--predict_points_csv={_PREDICT_POINTS_CSV.value}: no such file (a CSV with params and "
                              "tokens columns)")
        raw_header, table = csv_checks.read_table(_PREDICT_POINTS_CSV.value)
        header = csv_checks.header_names(_PREDICT_POINTS_CSV.value, raw_header, {})
        if "params" not in header or "tokens" not in header:
            raise ConfigError(f"--predict_points_csv={_PREDICT_POINTS_CSV.value}: the header must name params (or N) "
                              f"and tokens (or D); found: {', '.join(raw_header) or 'no header'}")
        for _, cells in table:
            row = dict(zip(header, cells))
            texts.append(f"{row.get('params', '')}:{row.get('tokens', '')}")
    return pairs + at_points.parse(texts, source=f"--predict_points_csv={_PREDICT_POINTS_CSV.value}")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        _fail(f"unexpected arguments {' '.join(argv[1:])!r}; pass options as --name=value")
    if (_SWEEP.value is None) == (_POINTS.value is None):
        _fail("give exactly one of --sweep=DIR or --points=FILE.csv")
    if not _OUT.value:
        _fail("--out=DIR is required")
    if _WHERE.value and _POINTS.value is None:
        _fail("--where filters the rows of --points=FILE.csv; a sweep directory has one setting")
    if _METRIC.value != "eval_loss" and _SWEEP.value is None:
        _fail("--metric picks what a sweep's runs recorded; a CSV's loss column is what --points fits")
    if _ACCURACY.value and (_SWEEP.value is None or _METRIC.value == "eval_loss"):
        _fail("--accuracy_metric is the second step of a task law: give --sweep=DIR and --metric (the task's "
              "bits per byte, e.g. --metric=tasks/arc_easy/bits_per_byte --accuracy_metric=tasks/arc_easy/acc)")
    if _COLUMNS.value and _POINTS.value is None:
        _fail("--columns names the columns of --points=FILE.csv; a sweep directory's keys are fixed")
    try:
        if _SWEEP.value is not None:
            points = points_lib.read_sweep(_SWEEP.value, n_kind=_N_KIND.value, metric=_METRIC.value)
        else:
            points = points_lib.read_csv(_POINTS.value, where=points_lib.parse_where(_WHERE.value),
                                         columns=csv_checks.parse_columns(_COLUMNS.value))
        fit = report.run_fit(
            points, _OUT.value, n_kind=_N_KIND.value,
            drop_highest=_DROP_HIGHEST.value, bootstrap=_BOOTSTRAP.value, seed=_SEED.value,
            isoflop_window=_ISOFLOP_WINDOW.value, isoflop_method=_METHOD.value, headline=_HEADLINE.value,
            predict_flops=_predict_flops(), approach3_near=_NEAR.value, predict_points=_predict_points(),
        )
        if _ACCURACY.value:  # the two-step law, from the fit's predictions of the metric
            fit["two_step"] = two_step.two_step(_SWEEP.value, _METRIC.value, _ACCURACY.value,
                                                fit.get("predictions", []))
            write_json(os.path.join(_OUT.value, "fit.json"), fit, indent=1, allow_nan=False)
    except ConfigError as e:  # the user's input; anything else is a bug and keeps its traceback
        _fail(str(e))
    print(report.summary(fit))
    if "two_step" in fit:
        sig = fit["two_step"]["sigmoid"]
        print(f"two-step law: {_ACCURACY.value} = {sig['floor']:.3f} + {sig['height']:.3f} / (1 + exp({sig['k']:.3g} "
              f"(x - {sig['x0']:.4g}))) on {sig['pairs']} evaluations (RMS residual {sig['rms_residual']:.3g})")
        for p in fit["two_step"]["predictions"]:
            if p["accuracy"] is not None:
                ci = p["accuracy_ci95"]
                print(f"  C = {p['flops']:.3g}: {_METRIC.value} {p['bits_per_byte']:.4f}, accuracy {p['accuracy']:.4f}"
                      + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""))
    print(f"wrote {_OUT.value}/fit.json and {', '.join(fit.get('figures', []))}")


if __name__ == "__main__":
    cli.run(main)  # flag errors (e.g. --drop_highest=-1) as one `error:` line, exit 2
