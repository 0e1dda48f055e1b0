"""The lines .ci/gpu_stages/gpu_quick.sh ends with, for a person to paste: the sweep's wall time against its limit
and estimate, its runs, the fit's a, the prediction check, and the rates its runs measured beside the ones the
config's estimate assumed (what replaces configs/sweeps/gpu_quick.py's H100 estimates once measured).

python3 .ci/gpu_stages/gpu_quick_summary.py SWEEP_DIR --wall=SECONDS --rc=EXIT_STATUS --limit=SECONDS

The rates: each ok run's training seconds (its summary.json) fitted as
train_seconds = trained_steps · (FLOPs per step / R + t0) + c (least squares over the runs), so R is the
sustained rate, t0 the fixed cost per step (t0 / layers: the config's τ) and c what a run spends in its training
loop besides its steps (first steps, checkpoints); compilation, evaluation and the rest of a run are medians.
Standard library and numpy only.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np


def _load(path: str):
    with open(path) as f:
        return json.load(f)


def _rows(sweep_dir: str) -> list[dict]:
    path = os.path.join(sweep_dir, "results.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rate_lines(doc: dict, rows: list[dict], sweep_dir: str) -> list[str]:
    """The measured rates (R, t0, per-run costs) beside the config's estimates."""
    runs = {r["run_id"]: r for r in doc["runs"]}
    xs, ys, compile_s, eval_s, other_s = [], [], [], [], []
    for row in rows:
        run, path = runs.get(row["run_id"]), os.path.join(sweep_dir, "runs", row["run_id"], "summary.json")
        if row.get("status") != "ok" or run is None or not os.path.exists(path):
            continue
        s = _load(path)
        steps = int(run["steps"]) - int(run.get("start_step") or 0)
        xs.append([steps * run["batch_size"] * run["seq_len"] * run["flops_per_token"], steps, 1.0])
        ys.append(float(s["train_seconds"]))
        compile_s.append(float(s.get("compile_seconds") or 0.0))
        eval_s.append(float(s.get("eval_seconds") or 0.0))
        other_s.append(float(s["wall_seconds"]) - ys[-1] - compile_s[-1] - eval_s[-1])
    sw = doc["sweep"]
    layers = int(sw.get("num_layers") or 0)
    assumed = (f"the config assumed R = {sw['estimate_flops_per_second']:.3g} FLOP/s, t0 = "
               f"{sw['estimate_step_overhead_s'] * 1e3:.3g} ms, {sw.get('estimate_compile_s', 0):.3g} s compilation "
               f"and {sw['estimate_run_overhead_s']:.3g} s more per run, {sw.get('estimate_setup_s', 0):.3g} s set-up")
    if len(xs) < 4:
        return [f"measured rates: too few finished runs ({len(xs)}) to fit; {assumed}"]
    (inv_r, t0, c), *_ = np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)
    fitted = (f"R = {1 / inv_r:.3g} FLOP/s" if inv_r > 0 else "R = n/a (no FLOP-proportional time resolved)") + \
        f", t0 = {t0 * 1e3:.3g} ms per step" + (f" ({t0 / layers * 1e3:.3g} ms per layer)" if layers else "") + \
        f", {c:.3g} s per run in the loop besides its steps"
    return [f"measured rates ({len(xs)} runs, train_seconds = steps·(FLOPs/R + t0) + c): {fitted}; per run "
            f"(median) {statistics.median(compile_s):.3g} s compilation, {statistics.median(eval_s):.3g} s "
            f"evaluation, {statistics.median(other_s):.3g} s else",
            f"  {assumed} (sweep.estimate_*)"]


def summary(sweep_dir: str, wall: float, rc: int, limit: float) -> list[str]:
    if not os.path.exists(os.path.join(sweep_dir, "sweep.json")):
        return [f"gpu_quick: exit {rc} after {wall:.0f} s: no sweep was written (see gpu_quick.log)"]
    doc, rows = _load(os.path.join(sweep_dir, "sweep.json")), _rows(sweep_dir)
    ok = [r for r in rows if r.get("status") == "ok"]
    sw = doc["sweep"]
    estimate = sum(r["estimated_seconds"] for r in doc["runs"]) + float(sw.get("estimate_setup_s") or 0.0)
    run_walls = sum(float(r.get("wall_seconds") or 0.0) for r in rows)
    lines = [f"gpu_quick ({doc['name']}): exit {rc}, wall {wall:.0f} s (limit {limit:.0f} s; the runs {run_walls:.0f} s, "
             f"the rest {wall - run_walls:.0f} s; the plan's estimate {estimate:.0f} s); {len(ok)} of "
             f"{len(doc['runs'])} runs ok, {len(rows) - len(ok)} failed or diverged",
             f"budgets {', '.join(f'{c:.3g}' for c in sw['budgets'])} FLOPs, {sw['sizes_per_budget']} sizes each, "
             f"prediction at {sw.get('validate_flops') or 0:.3g}; N {min((r['params'] for r in doc['runs']), default=0):,}"
             f"..{max((r['params'] for r in doc['runs']), default=0):,}, non-embedding share at least "
             f"{min((r['params_non_embedding'] / r['params'] for r in doc['runs']), default=0):.0%}; epochs at most "
             f"{max((float(r.get('epochs') or 0) for r in ok), default=0):.2g}"]
    fit_path = os.path.join(sweep_dir, "fit", "fit.json")
    if os.path.exists(fit_path):
        fit = _load(fit_path)
        for name in ("approach2", "approach3"):
            res = fit.get(name) or {}
            ci = res.get("a_ci95")
            lines.append(f"fit {name} ({fit['headline']['convention']}): " + (
                f"a = {res['a']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "") + f", b = {res['b']:.3f}"
                if res.get("a") is not None else f"not fitted: {res.get('note', 'no result')}"))
    else:
        lines.append("fit: none (the sweep did not reach it)")
    pred, check = (os.path.join(sweep_dir, "fit", name) for name in ("predictions.json", "validation.json"))
    if os.path.exists(check) and _load(check).get("measured_loss") is not None:
        v = _load(check)
        ci = v.get("predicted_loss_ci95")
        lines.append(f"prediction check at {v['flops']:.3g} FLOPs ({v['run_id']}): predicted {v['predicted_loss']:.4f}"
                     + (f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "") + f", measured {v['measured_loss']:.4f}, "
                     f"error {100 * v['relative_error']:+.2f}%, "
                     + {True: "inside", False: "OUTSIDE", None: "no interval"}[v.get("inside_ci95")])
    elif os.path.exists(pred):
        lines.append(f"prediction written ({pred}), not yet checked: its run did not finish")
    else:
        lines.append("prediction: none written")
    return lines + rate_lines(doc, rows, sweep_dir)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir")
    p.add_argument("--wall", type=float, required=True)
    p.add_argument("--rc", type=int, required=True)
    p.add_argument("--limit", type=float, required=True)
    a = p.parse_args()
    print("\n".join(summary(a.sweep_dir, a.wall, a.rc, a.limit)))


if __name__ == "__main__":
    main()
