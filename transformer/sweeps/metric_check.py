"""The prediction check of the metrics named in sweep.predict_metrics (a task's correct-answer bits per byte, a named
evaluation set's bits per byte or loss), beside the loss's (outcome.py):

  predict     each metric fitted over the grid as the loss is (`fit`: scaling/report.run_fit on the sweep's
              rows read with `metric`, the same approaches, frontier, backtest and calibrated 95%
              intervals as experiments.fit --metric) and its compute-optimal value at sweep.validate_flops
              predicted; outcome.predict writes these into DIR/fit/predictions.json ("metrics") with the loss's,
              before the validation run trains
  validation  the validation run's measured value of each metric against its prediction (validation.json's
              "metrics")
  finish      each metric fitted again at the end into DIR/fit/metrics/<metric, '/' as '_'>/ (fit.json and the
              figures, the validation run drawn beside its prediction)

The validation run is the loss's predicted compute-optimal model: a metric whose own optimum (`params` of its
prediction) lies at another size sits above its frontier there, so its check reads optimistic; validation.json
gives both sizes. A metric whose fit cannot predict (no frontier) is recorded with a note and not checked.
"""
from __future__ import annotations

import os
from typing import Any

from transformer.spec import ConfigError, MissingInputError, metric_keys

PREFIX = "loss"     # what run_fit's predictions call the fitted metric's value ...
RENAMED = "value"   # ... and what predictions.json's "metrics" call it


def names(doc: dict[str, Any]) -> list[str]:
    """The metrics the sweep predicts beside the loss (sweep.json's sweep.predict_metrics; absent: none)."""
    return [m for m in str(doc["sweep"].get("predict_metrics") or "").split(",") if m]


def metric_dir(workdir: str, metric: str) -> str:
    """DIR/fit/metrics/<metric with '/' as '_'>: the metric's fit.json and figures."""
    return os.path.join(workdir, "fit", "metrics", metric.replace("/", "_"))


def fit(workdir: str, doc: dict[str, Any], metric: str, annotate: dict[str, Any] | None = None,
        make_plots: bool = True, out_dir: str | None = None) -> dict[str, Any]:
    """The fit of `metric` over the sweep's rows (scaling/report.run_fit with the sweep's N convention and
    bootstrap, predicting at sweep.validate_flops), written to `out_dir` (default metric_dir; fit.json, and the
    figures with `make_plots`): the loss's (outcome._fit, into DIR/fit) and each predicted metric's."""
    from transformer.scaling import points
    from transformer.scaling.report import run_fit

    n_kind = "params" if doc["sweep"]["param_count"] == "total" else "params_non_embedding"
    validate_flops = float(doc["sweep"].get("validate_flops") or 0.0)
    return run_fit(points.read_sweep(workdir, n_kind=n_kind, metric=metric), out_dir or metric_dir(workdir, metric),
                   n_kind=n_kind, bootstrap=int(doc["sweep"].get("fit_bootstrap", 0)), seed=0,
                   predict_flops=[validate_flops] if validate_flops else (), annotate=annotate, make_plots=make_plots)


def compare(measured: float | None, predicted: float | None, ci: Any) -> dict[str, Any]:
    """`relative_error` of a measurement against its prediction and whether it is `inside_ci95` (None where either
    is missing, or there is no interval): the loss's check (outcome.validation) and each metric's."""
    checked = measured is not None and predicted is not None
    return {"relative_error": (measured - predicted) / predicted if checked else None,
            "inside_ci95": bool(ci[0] <= measured <= ci[1]) if checked and ci and None not in ci else None}


def verdict(inside: bool | None) -> str:
    """compare's inside_ci95 in words, as the console's prediction-check lines say it."""
    return ("no interval to check against" if inside is None else
            "inside its 95% interval" if inside else "OUTSIDE its 95% interval")


def _renamed(pred: dict[str, Any]) -> dict[str, Any]:
    """A run_fit prediction with its `loss*` keys as `value*` (the metric is not a loss)."""
    return {(RENAMED + k[len(PREFIX):] if k.startswith(PREFIX) else k): v for k, v in pred.items()}


def predict(workdir: str, doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{metric: its prediction at sweep.validate_flops, as the loss's}: `value` (the compute-optimal value),
    `value_ci95` (and its source), `params`/`tokens` (the metric's own N_opt, D_opt), `convention`, `fit` (where the
    fit is); where the fit cannot predict, `value` null and `note`."""
    out, flops = {}, float(doc["sweep"].get("validate_flops") or 0.0)
    for metric in names(doc):
        try:
            result = fit(workdir, doc, metric, make_plots=False)  # drawn at the end, with the check
        except (ConfigError, MissingInputError) as e:  # e.g. no grid run recorded a finite value of it
            out[metric] = {"flops": flops, "value": None, "note": f"{metric} could not be fitted: {e}"}
            continue
        pred = _renamed(result["predictions"][0])
        if pred.get("value") is None:
            pred["note"] = f"the fit of {metric} cannot predict at {flops:.3g} FLOPs ({pred.get('note', 'no frontier')})"
        out[metric] = {**pred, "convention": result["headline"]["convention"],
                       "fit": os.path.relpath(metric_dir(workdir, metric), workdir),
                       "from": {"frontier": result["frontier"].get("law"), "sigma": result["noise"].get("sigma"),
                                "grid_runs": len(result["points"])}}
    return out


def validation(row: dict[str, Any], prediction: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{metric: the check} of the validation run's results row against predictions.json's "metrics": `predicted`,
    `predicted_ci95`, `measured` (null unless the run is ok and recorded it), `relative_error`, `inside_ci95`,
    `predicted_params` (the metric's own N_opt) beside the run's `params`."""
    out = {}
    for metric, pred in (prediction.get("metrics") or {}).items():
        value = metric_keys.value(row, metric) if row.get("status") == "ok" else None
        measured = float(value) if isinstance(value, (int, float)) else None
        predicted, ci = pred.get("value"), pred.get("value_ci95")
        out[metric] = {"flops": row["flops"], "params": row["params"], "predicted": predicted,
                       "predicted_ci95": ci, "predicted_params": pred.get("params"), "measured": measured,
                       **compare(measured, predicted, ci),
                       **({"note": pred["note"]} if pred.get("note") else {})}
    return out


def finish(workdir: str, doc: dict[str, Any], checked: dict[str, Any] | None) -> dict[str, str]:
    """Each metric fitted at the end into metric_dir (its validation drawn beside its prediction: the keys
    plots.py reads of fit.json's `validation`); {metric: the fit's directory, or why there is none}."""
    out = {}
    for metric in names(doc):
        check = ((checked or {}).get("metrics") or {}).get(metric)
        annotate = None
        if check and check.get("relative_error") is not None:
            annotate = {"validation": {"flops": check["flops"], "tokens": checked["tokens"],
                                       "params": check["params"], "measured_loss": check["measured"],
                                       "predicted_loss": check["predicted"],
                                       "relative_error": check["relative_error"]}}
        try:
            fit(workdir, doc, metric, annotate)
            out[metric] = os.path.relpath(metric_dir(workdir, metric), workdir)
        except (ConfigError, MissingInputError) as e:
            out[metric] = f"not fitted: {e}"
    return out


def prediction_lines(pred: dict[str, Any]) -> list[str]:
    """One line per metric predicted (printed with the loss's prediction)."""
    lines = []
    for metric, p in (pred.get("metrics") or {}).items():
        if p.get("value") is None:
            lines.append(f"warning: {p['note']}: no check of {metric}")
            continue
        ci = p.get("value_ci95") or [float("nan"), float("nan")]
        lines.append(f"prediction of {metric} at {p['flops']:.3g} FLOPs: {p['value']:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]"
                     + (f" (its own N_opt {p['params']:.3g})" if p.get("params") else ""))
    return lines


def validation_lines(checked: dict[str, Any]) -> list[str]:
    """One line per metric checked, as outcome.validation_line says the loss's."""
    lines = []
    for metric, c in (checked.get("metrics") or {}).items():
        if c.get("relative_error") is None:
            continue
        ci = c.get("predicted_ci95")
        lines.append(f"prediction check of {metric} at {c['flops']:.3g} FLOPs: predicted {c['predicted']:.4f}"
                     + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci and None not in ci else "")
                     + f", measured {c['measured']:.4f}: relative error {100 * c['relative_error']:+.2f}%, "
                     + verdict(c.get("inside_ci95")))
    return lines
