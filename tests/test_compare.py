"""experiments.compare on synthetic sweeps of a known law: the variant's law is the baseline's at m times
the compute (N → √m·N, D → √m·D, so L_var_opt(C) = L_base_opt(m·C) exactly), and the compute multiplier
must come back as m, within its interval, at every budget and extrapolated."""
from __future__ import annotations

import json
import os

import numpy as np

from sweep_fixture import TRUE_A, g_coef, law, shape

BUDGETS = (1e12, 3e12, 1e13, 3e13)
WIDTHS = tuple(range(16, 257, 8))


def write_sweep_dir(root: str, *, m: float = 1.0, seed: int = 0, sigma: float = 0.003, budgets=BUDGETS,
                    e_shift: float = 0.0, drop: int = 0, failed: int = 0) -> list[dict]:
    """A sweep directory (sweep.json + results.jsonl, as experiments.sweep writes them) whose losses are
    the fixture's law at √m·N_eff, √m·D (plus `e_shift` on E) times exp(σ·z). Per budget the widths nearest
    7 sizes spanning 25x around the baseline's optimum, three seeds at the 3 sizes nearest it. The last
    `drop` runs have no row; the `failed` runs before them a failed row."""
    rng = np.random.default_rng(seed)
    runs, rows = [], []
    shapes = [shape(d) for d in WIDTHS]
    n_eff = np.array([s["flops_per_token"] / 6 for s in shapes])
    for budget in budgets:
        n_opt = g_coef() * (budget / 6) ** TRUE_A
        nearest = np.unique([int(np.argmin(np.abs(np.log(n_eff / t)))) for t in n_opt * np.geomspace(0.2, 5, 7)])
        third = np.sort(np.abs(np.log(n_eff[nearest] / n_opt)))[2]
        for i in nearest:
            s, tokens = shapes[i], budget / shapes[i]["flops_per_token"]
            for r in range(3 if abs(np.log(n_eff[i] / n_opt)) <= third else 1):
                loss = (law(np.sqrt(m) * n_eff[i], np.sqrt(m) * tokens) + e_shift) * np.exp(rng.normal(0, sigma))
                run = {"run_id": f"d{s['d_model']}-L{s['num_layers']}-C{budget:.0e}-s{r}", "budget": budget,
                       "tokens": tokens, "flops": budget, **s}
                runs.append({**run, "index": len(runs)})
                rows.append({**run, "status": "ok", "eval_loss": float(loss), "mode": "isoflop"})
    for row in rows[len(rows) - drop - failed:len(rows) - drop]:
        row.update(status="failed", eval_loss=None, error="RuntimeError: boom")
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "sweep.json"), "w") as f:
        json.dump({"name": "synthetic", "mode": "isoflop", "sweep": {"budgets": list(budgets)}, "runs": runs}, f)
    with open(os.path.join(root, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows[:len(rows) - drop])
    return rows
