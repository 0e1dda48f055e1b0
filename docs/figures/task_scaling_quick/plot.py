"""The lab note's figures (docs/results/2026-11-27-task-scaling-quick-sweep.md) from this folder's files:
task_scaling.png (each predicted metric against compute: the runs, each metric's frontier through its IsoFLOP
minima, the prediction written before the validation run trained, and what that run measured) and accuracy.png
(the tasks' acc and acc_norm against compute, beside chance and the pick-the-shortest-answer baseline).

    python docs/figures/task_scaling_quick/plot.py
"""
from __future__ import annotations

import json
import os

import numpy as np
from matplotlib import colors, figure
from matplotlib.cm import ScalarMappable

from transformer.spec.metric_keys import value as _value  # a row's metric by its key (eval/…, tasks/…)

HERE = os.path.dirname(os.path.abspath(__file__))
METRICS = ("tasks/basic_skills_coding/bits_per_byte", "tasks/arc_easy/bits_per_byte", "eval/absl/bits_per_byte",
           "eval/licenses/bits_per_byte")
TASKS = {"arc_easy": (0.25, 0.279), "basic_skills_coding": (0.20, 0.121)}  # chance, shortest-answer baseline


def _load() -> tuple[list[dict], dict, dict, dict]:
    with open(os.path.join(HERE, "results.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    read = lambda name: json.load(open(os.path.join(HERE, name)))
    return rows, read("predictions.json"), read("validation.json"), read("fits.json")


def task_scaling(rows: list[dict], pred: dict, checked: dict, fits: dict) -> str:
    fig = figure.Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(2, 2).ravel()
    grid = [r for r in rows if r["role"] == "grid"]
    norm = colors.LogNorm(min(r["params"] for r in rows), max(r["params"] for r in rows))
    cmap = "viridis"
    flops_G = np.geomspace(7e10, 2.2e12, 200)
    for ax, metric in zip(axes, METRICS):
        ax.scatter([r["flops"] for r in grid], [_value(r, metric) for r in grid], c=[r["params"] for r in grid],
                   norm=norm, cmap=cmap, s=22, zorder=2, label="grid runs (colour: N)")
        minima = fits[metric]["minima"]
        ax.scatter([m["flops"] for m in minima], [m["value_opt"] for m in minima], marker="*", s=110, color="C1",
                   edgecolor="k", lw=0.5, zorder=3, label="IsoFLOP minima")
        law = fits[metric]["frontier"]
        ax.plot(flops_G, law["E"] + law["k"] * flops_G ** -law["gamma"], "--", color="C1", lw=1.2,
                label=f"frontier {law['E']:.2f} + k·C^-{law['gamma']:.2f}")
        p, c = pred["metrics"][metric], checked["metrics"][metric]
        lo, hi = p["value_ci95"]
        ax.errorbar([p["flops"]], [p["value"]], yerr=[[p["value"] - lo], [hi - p["value"]]], fmt="D", color="C3",
                    capsize=4, zorder=4, label=f"predicted {p['value']:.3f} [{lo:.3f}, {hi:.3f}]")
        ax.scatter([c["flops"]], [c["measured"]], marker="X", s=90, color="k", zorder=5,
                   label=f"measured {c['measured']:.3f} ({100 * c['relative_error']:+.1f}%)")
        ax.set(xscale="log", xlabel="compute C (FLOPs)", ylabel="bits per byte", title=metric)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=list(axes), label="parameters N", shrink=0.6)
    fig.suptitle("quick sweep: bits per byte of the correct answer (tasks) and of held-out sets, against compute; "
                 "the check at 1.6e12 FLOPs", fontsize=10)
    path = os.path.join(HERE, "task_scaling.png")
    fig.savefig(path, dpi=110)
    return path


def accuracy(rows: list[dict]) -> str:
    fig = figure.Figure(figsize=(10, 3.8), layout="constrained")
    for ax, (task, (chance, shortest)) in zip(fig.subplots(1, 2), TASKS.items()):
        for key, marker in (("acc", "o"), ("acc_norm", "s")):
            grid = [r for r in rows if r["role"] == "grid"]
            ax.scatter([r["flops"] for r in grid], [r["tasks"][task][key] for r in grid], marker=marker, s=18,
                       label=f"{key} (grid runs)")
            val = next(r for r in rows if r["role"] == "validate")
            ax.scatter([val["flops"]], [val["tasks"][task][key]], marker=marker, s=50, color="k", zorder=3)
        docs = rows[0]["tasks"][task]["docs"]
        ax.axhline(chance, color="C3", lw=1, label=f"chance ({chance:.2f})")
        ax.axhspan(chance - 2 * np.sqrt(chance * (1 - chance) / docs), chance + 2 * np.sqrt(chance * (1 - chance) / docs),
                   color="C3", alpha=0.1, lw=0, label=f"chance ± 2 s.e. ({docs} documents)")
        ax.axhline(shortest, color="0.4", ls=":", lw=1, label=f"always the shortest answer ({shortest:.3f})")
        ax.set(xscale="log", xlabel="compute C (FLOPs)", ylabel="accuracy", title=f"{task} (black: the validation run)",
               ylim=(0.0, 0.4))
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    path = os.path.join(HERE, "accuracy.png")
    fig.savefig(path, dpi=110)
    return path


if __name__ == "__main__":
    data = _load()
    print(task_scaling(*data))
    print(accuracy(data[0]))
