"""A synthetic sweep directory (results.jsonl as the runner writes it) of a known law, for the fit tests.

Loss L = E + A/N_eff^α + B/D^β with N_eff = FLOPs/(6·D) (attention counted), multiplicative noise σ,
seed replicates for the three sizes nearest each optimum; shapes: width d, 2 layers, head_dim 8,
vocabulary 256, seq_len 128 (embeddings are a large share of N at small d, as in the `cpu` sweep).
"""
from __future__ import annotations

import json
import os

import numpy as np

E, A, B, ALPHA, BETA = 1.6, 30.0, 60.0, 0.35, 0.30
TRUE_A = BETA / (ALPHA + BETA)
VOCAB, LAYERS, HEAD_DIM, SEQ = 256, 2, 8, 128


def shape(d: int) -> dict[str, float]:
    heads = d // HEAD_DIM
    blocks = LAYERS * 12 * d * d
    matmul = blocks + VOCAB * d  # untied head
    return {"d_model": d, "num_layers": LAYERS, "num_heads": heads, "head_dim": HEAD_DIM, "d_ff": 4 * d,
            "seq_len": SEQ, "params": blocks + 2 * VOCAB * d + 2 * LAYERS * 2 * d,
            "params_non_embedding": blocks + VOCAB * d + 2 * LAYERS * 2 * d,
            "flops_per_token": 6.0 * matmul + 12.0 * LAYERS * SEQ * heads * HEAD_DIM}


def law(n_eff: np.ndarray, d: np.ndarray) -> np.ndarray:
    return E + A / n_eff**ALPHA + B / d**BETA


def g_coef() -> float:
    return (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))


def write_sweep(root: str, budgets=(1e12, 3e12, 1e13, 3e13), sigma: float = 0.003, seeds: int = 3,
                seed: int = 0, widths=tuple(range(16, 257, 8))) -> list[dict]:
    """Writes root/results.jsonl: per budget the widths nearest 7 sizes spanning 25x around its optimum,
    three seeds at the 3 sizes nearest the optimum; returns the rows."""
    rng = np.random.default_rng(seed)
    rows = []
    for budget in budgets:
        n_opt = g_coef() * (budget / 6) ** TRUE_A
        shapes = [shape(d) for d in widths]
        n_eff = np.array([s["flops_per_token"] / 6 for s in shapes])
        targets = n_opt * np.geomspace(1 / 5, 5, 7)  # sizes spanning 25x around the optimum
        nearest = np.unique([int(np.argmin(np.abs(np.log(n_eff / t)))) for t in targets])
        for i in nearest:
            s = shapes[i]
            tokens = budget / s["flops_per_token"]
            reps = seeds if abs(np.log(n_eff[i] / n_opt)) <= np.sort(np.abs(np.log(n_eff[nearest] / n_opt)))[2] else 1
            for r in range(reps):
                loss = law(n_eff[i], tokens) * np.exp(rng.normal(0, sigma))
                rows.append({"run_id": f"C{budget:.0e}-d{s['d_model']}-s{r}", "status": "ok", "budget": budget,
                             "tokens": tokens, "flops": budget, "eval_loss": float(loss), "seed": r, **s})
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return rows
