"""What a sweep concludes: the fit of its grid, the prediction written before the validation run trains, the
validation against it, and the schedule check (the Fit and Prediction-check contracts, docs/design.md).

DIR/fit/fit.json + figures      the fit of the grid runs (role "grid"; transformer/scaling/report.run_fit)
DIR/fit/predictions.json        sweep.validate_flops: the predicted N_opt, D_opt and loss with 95% intervals and
                                the time it was written, before anything trains at that budget; never rewritten
DIR/fit/validation.json         the validation run against the prediction: measured loss, relative error
DIR/fit/metrics/METRIC/         sweep.predict_metrics: each metric's fit; its prediction and check are in
                                predictions.json's and validation.json's "metrics" (sweeps/metric_check.py)
DIR/fit/schedule_check.json     sweep.schedule_check: each check run's loss beside the grid run it repeats
DIR/lr_fit.json (+ lr_scan.png) an LR scan's fit (sweep.mode=lr_scan)
DIR/fit/fitted_from.json        the digest of results.jsonl the last fit was made from: a rerun with the same
                                rows prints that fit (current_fit) and writes nothing
The rows are read through execute.read_rows (the failure rule: a diverged run is reported, never fitted).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
from typing import Any

import numpy as np

from transformer import file_claims, files
from transformer.sweeps import execute, metric_check, results


def _fit_dir(workdir: str) -> str:
    return os.path.join(workdir, "fit")


def _write(workdir: str, name: str, obj: dict[str, Any]) -> None:
    """DIR/fit/NAME, atomically; DIR/fit is made where this is the first file in it."""
    os.makedirs(_fit_dir(workdir), exist_ok=True)
    files.write_json(os.path.join(_fit_dir(workdir), name), obj, indent=1)


def _fit(workdir: str, doc: dict[str, Any], annotate: dict[str, Any] | None = None) -> dict[str, Any]:
    """The loss's fit into DIR/fit (metric_check.fit: each predicted metric's is made the same way)."""
    return metric_check.fit(workdir, doc, "eval_loss", annotate, out_dir=_fit_dir(workdir))


def load_prediction(workdir: str) -> dict[str, Any] | None:
    path = os.path.join(_fit_dir(workdir), "predictions.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def predict(workdir: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Fits the grid and writes DIR/fit/predictions.json (once: an existing one is returned as it is), before
    the validation run is designed. Its `params` is N_opt in the fit's headline convention (`convention`);
    where the fit cannot predict (too few budget minima for a frontier) `params` and `loss` are null and `note`
    says why, and the sweep ends without a validation run. With sweep.predict_metrics, `metrics` holds each
    metric's prediction at the same budget (metric_check.predict), written in the same file at the same time."""
    existing = load_prediction(workdir)
    if existing is not None:
        return existing
    fit = _fit(workdir, doc)
    pred = fit["predictions"][0]
    if pred.get("loss") is None or pred.get("params") is None:  # recorded as such: the sweep ends without it
        pred = {**pred, "params": None, "loss": None,
                "note": f"the fit of the grid cannot predict at {pred['flops']:.3g} FLOPs "
                        f"({pred.get('note', 'no frontier')}): no validation run"}
    prediction = {**pred, "convention": fit["headline"]["convention"],
                  "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "from": {"a": fit["approach2"].get("a"), "a_ci95": fit["approach2"].get("a_ci95"),
                           "frontier": fit["frontier"].get("law"), "sigma": fit["noise"].get("sigma"),
                           "grid_runs": len(fit["points"]),
                           "backtest": {k: v for k, v in (fit["frontier"].get("backtest") or {}).items() if k != "method"},
                           "frontier_warning": fit["frontier"].get("warning")}}
    if prediction["params"] is not None and metric_check.names(doc):  # checked on the same validation run
        prediction["metrics"] = metric_check.predict(workdir, doc)
    _write(workdir, "predictions.json", prediction)
    return prediction


def validation(workdir: str, doc: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """DIR/fit/validation.json from the validation run's row and predictions.json (None: no validation run)."""
    row = next((r for r in rows if r.get("role") == "validate"), None)
    prediction = load_prediction(workdir)
    if row is None or prediction is None:
        return None
    measured = row.get("eval_loss") if row.get("status") == "ok" else None
    ci = prediction.get("loss_ci95")
    out = {"flops": row["flops"], "params": row["params"], "tokens": row["tokens"], "run_id": row["run_id"],
           "shape": {k: row.get(k) for k in ("d_model", "num_layers", "num_heads", "d_ff")},
           "predicted_params": prediction["params"], "predicted_tokens": prediction.get("tokens"),
           "convention": prediction["convention"], "predicted_loss": prediction["loss"],
           "predicted_loss_ci95": ci, "measured_loss": measured,
           **metric_check.compare(measured, prediction["loss"], ci),
           "prediction_written_at": prediction["written_at"], "status": row.get("status")}
    if prediction.get("metrics"):
        out["metrics"] = metric_check.validation(row, prediction)
    _write(workdir, "validation.json", out)
    return out


def schedule_check(workdir: str, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """DIR/fit/schedule_check.json: each check run beside the grid run of the same shape and budget (seed 0)."""
    checks = [r for r in rows if r.get("role") == "check" and r.get("status") == "ok"]
    if not checks:
        return None
    grid = {(r["budget"], r["d_model"]): r for r in rows if r.get("role", "grid") == "grid" and r.get("status") == "ok"
            and r.get("seed", 0) == checks[0].get("seed", 0)}
    pairs = []
    for c in sorted(checks, key=lambda r: r["params"]):
        g = grid.get((c["budget"], c["d_model"]))
        if g is not None:
            pairs.append({"budget": c["budget"], "params": c["params"], "d_model": c["d_model"],
                          g["schedule"]: g["eval_loss"], c["schedule"]: c["eval_loss"],
                          "difference": g["eval_loss"] - c["eval_loss"],
                          "relative": (g["eval_loss"] - c["eval_loss"]) / c["eval_loss"]})
    if not pairs:
        return None
    best = lambda key: min(pairs, key=lambda p: p[key])["params"]
    names = (pairs[0].keys() - {"budget", "params", "d_model", "difference", "relative"})
    best_size = {n: best(n) for n in names}
    moved = len(set(best_size.values())) > 1
    out = {"pairs": pairs, "best_size": best_size, "minimum_moved": moved,
           "mean_relative_difference": sum(p["relative"] for p in pairs) / len(pairs),
           "note": "difference = grid schedule's loss − the check schedule's, per size; best_size: the lowest-loss "
                   "checked size under each schedule" + (" (they differ: the schedule moved this budget's best size "
                   "by one or more of the checked sizes)" if moved else " (the same: the schedule did not move it)")}
    _write(workdir, "schedule_check.json", out)
    return out


def _results_digest(workdir: str) -> str:
    """sha256 of DIR/results.jsonl's bytes (of nothing when there is none)."""
    h = hashlib.sha256()
    path = os.path.join(workdir, results.RESULTS)
    if os.path.exists(path):
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _fit_path(workdir: str, doc: dict[str, Any]) -> str:
    return os.path.join(workdir, "lr_fit.json") if doc["mode"] == "lr_scan" else os.path.join(_fit_dir(workdir), "fit.json")


def current_fit(workdir: str, doc: dict[str, Any]) -> dict[str, Any] | None:
    """The fit DIR holds (fit.json, or an LR scan's lr_fit.json) when it was made from results.jsonl as it is
    now (DIR/fit/fitted_from.json), else None: then finish() fits again."""
    stamp = os.path.join(_fit_dir(workdir), "fitted_from.json")
    try:
        with open(stamp) as f:
            fitted = json.load(f)
        with open(_fit_path(workdir, doc)) as f:
            fit = json.load(f)
    except (OSError, ValueError):
        return None
    return fit if fitted.get("results_sha256") == _results_digest(workdir) else None


def finish(workdir: str, doc: dict[str, Any], announce: bool = True) -> dict[str, Any]:
    """After the last run: the fit into DIR/fit/ (validation and schedule check beside it) or, for an LR scan,
    DIR/lr_fit.json; then DIR/fit/fitted_from.json. `announce`: print the prediction check (the command line
    prints it in its end summary)."""
    digest = _results_digest(workdir)  # before reading: a row appended meanwhile makes the fit stale
    rows = execute.read_rows(workdir)
    if doc["mode"] == "lr_scan":
        from transformer.scaling import lr_scan
        fit = lr_scan.write_lr_fit(workdir, rows, doc["sweep"]["param_count"])
    else:
        checked = validation(workdir, doc, rows)
        check = schedule_check(workdir, rows)
        metric_fits = metric_check.finish(workdir, doc, checked) if metric_check.names(doc) else None
        fit = _fit(workdir, doc, annotate={k: v for k, v in (("validation", checked), ("schedule_check", check),
                                                             ("metric_fits", metric_fits)) if v})
        if announce and checked is not None and checked["measured_loss"] is not None:
            print(validation_line(checked), flush=True)
        if announce and checked is not None:
            for line in metric_check.validation_lines(checked):
                print(line, flush=True)
    _write(workdir, "fitted_from.json", {"results_sha256": digest, "fit": os.path.relpath(_fit_path(workdir, doc),
                                                                                           workdir)})
    return fit


def finish_once(workdir: str, doc: dict[str, Any]) -> dict[str, Any] | None:
    """finish() by the first worker to find every run recorded, the plan complete and no fit of the rows as they
    are (current_fit; DIR/fit.claim: one at a time). None: nothing to fit, or fitted already."""
    recorded = {r["run_id"] for r in results.read_results(workdir)}
    if doc.get("waiting") is not None or not all(r["run_id"] in recorded for r in doc["runs"]) \
            or current_fit(workdir, doc) is not None:
        return None
    with file_claims.hold(os.path.join(workdir, "fit.claim")):
        if current_fit(workdir, doc) is None:
            return finish(workdir, doc)
    return None


# ---------------------------------------------------------------- what the console says about the outcome

PLAUSIBLE_A = (0.2, 0.9)   # N_opt ∝ C^a: published fits lie within (Kaplan 0.73, Chinchilla 0.46–0.50)
CREDIBLE_GAP = 0.15        # an approach this far from the approaches' median a, its interval not covering it


def prediction_line(workdir: str, pred: dict[str, Any]) -> str:
    """The line printed when the prediction is written, before the validation run trains."""
    ci = pred.get("loss_ci95") or [float("nan"), float("nan")]
    return (f"prediction written to {workdir}/fit/predictions.json before anything trains at {pred['flops']:.3g} "
            f"FLOPs: N_opt {pred['params']:.3g} ({pred['convention']}), D_opt {pred['tokens']:.3g}, loss "
            f"{pred['loss']:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]")


def announce_prediction(workdir: str, pred: dict[str, Any]) -> None:
    """Prints the prediction just written (prediction_line), or the warning that the fit could not predict."""
    if pred.get("params") is None:
        print(f"warning: {pred['note']}; see {workdir}/fit/fit.json", flush=True)
    else:
        print(prediction_line(workdir, pred), flush=True)
        for line in metric_check.prediction_lines(pred):
            print(line, flush=True)


def validation_line(checked: dict[str, Any]) -> str:
    """The prediction check in one line: predicted and measured loss, the error, and whether the measurement
    landed inside the prediction's 95% interval (validation.json's inside_ci95)."""
    ci = checked.get("predicted_loss_ci95")
    verdict = metric_check.verdict(checked.get("inside_ci95"))
    return (f"prediction check at {checked['flops']:.3g} FLOPs: predicted loss {checked['predicted_loss']:.4f}"
            + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "")
            + f", measured {checked['measured_loss']:.4f}: relative error {100 * checked['relative_error']:+.2f}%, "
            + verdict)


def credibility(fit: dict[str, Any]) -> list[str]:
    """Why an approach's exponent a is not credible: outside PLAUSIBLE_A, or (with 3 approaches) more than
    CREDIBLE_GAP from the median of those inside PLAUSIBLE_A (at least 2 of them) with a 95% interval that does not
    cover it. Each warning names the approaches that hold up, or says that none does. Empty: every estimate holds up.

    The median leaves out the implausible ones: two wild estimates (from three budgets on another CPU's rounding,
    -0.21 and -0.17) would otherwise make the one plausible estimate the odd one out."""
    found = {name: fit[name] for name in ("approach1", "approach2", "approach3")
             if isinstance(fit.get(name), dict) and fit[name].get("a") is not None}
    inside = {name: PLAUSIBLE_A[0] <= float(r["a"]) <= PLAUSIBLE_A[1] for name, r in found.items()}
    plausible = [float(r["a"]) for name, r in found.items() if inside[name]]
    median = float(np.median(plausible)) if len(found) >= 3 and len(plausible) >= 2 else None
    reasons = {}
    for name, r in found.items():
        a, ci = float(r["a"]), r.get("a_ci95")
        why = []
        if not inside[name]:
            why.append(f"outside the {PLAUSIBLE_A[0]}–{PLAUSIBLE_A[1]} that published fits span")
        if median is not None and abs(a - median) > CREDIBLE_GAP and not (ci and ci[0] <= median <= ci[1]):
            why.append(f"{abs(a - median):.2f} from the plausible approaches' median {median:.3f}, beyond its own "
                       "interval")
        if why:
            reasons[name] = why
    holding = [name for name in found if name not in reasons]
    advice = (f"read {' and '.join(holding)}" if holding else
              "no approach holds up: these budgets do not pin the exponent (more budgets, or more sizes per budget)")
    return [f"{name}'s a = {float(found[name]['a']):.3f} is not credible ({'; '.join(why)}): {advice}"
            for name, why in reasons.items()]


_ROLE_WHY = {"validate": " (the validation run: checked against the prediction, never fitted)",
             "lr": " (a learning-rate calibration run)", "check": " (a schedule-check run: DIR/fit/schedule_check.json)"}


def _role(reason: Any) -> str:
    return str(reason).split("'")[1] if str(reason).startswith("role='") else ""


def summary_lines(fit: dict[str, Any], rows: list[dict[str, Any]] = ()) -> list[str]:
    """What the end of a sweep adds to the fit's summary: each excluded point and why (a diverged or failed run's
    reason from its row in `rows`), the approaches whose estimate is not credible, and the prediction check."""
    why = {r["run_id"]: r.get("error") for r in rows if r.get("status") != execute.OK and r.get("error")}
    lines = [f"excluded {p.get('id')}: {p.get('reason')}{_ROLE_WHY.get(_role(p.get('reason')), '')}"
             + (f" ({why[p.get('id')]})" if p.get("id") in why and not _role(p.get("reason")) else "")
             for p in fit.get("points_excluded", [])]
    lines += [f"warning: {w}" for w in credibility(fit)]
    checked = fit.get("validation")
    if checked and checked.get("measured_loss") is not None:
        lines.append(validation_line(checked))
    if checked:
        lines += metric_check.validation_lines(checked)
    return lines

