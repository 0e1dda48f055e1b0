"""Analysis of a learning-rate scan: each size's optimal peak LR, then lr_opt = c · N^k across sizes.

Per size, the optimum is the vertex of the parabola in log(lr) through the best point and its two
neighbours (clipped to that bracket). A diverged run (a non-finite loss or gradient, or a non-finite
eval loss) is an observation: worse than every finite one. When the best finite point's neighbour
diverged, the optimum is that point (bracketed by the divergence, method "best"). When the best point
is the scan's lowest or highest learning rate the optimum is not bracketed: it is reported at that
edge with `at_edge` set, and left out of the power-law fit when at least two bracketed optima remain
(a size whose every rate diverged has no optimum and is left out too). DIR/lr_fit.json is what an
IsoFLOP sweep reads through --config.sweep.lr_fit=DIR/lr_fit.json.
"""
from __future__ import annotations

import math
import os
from typing import Any, Sequence

import numpy as np

from transformer import files
from transformer.scaling import verdict
from transformer.spec import ConfigError

diverged, observed = verdict.diverged, verdict.observed  # the one failure rule (verdict.py)


def loss_of(row: dict[str, Any]) -> float:
    """An observed row's eval loss; inf for a diverged run."""
    return math.inf if diverged(row) else float(row["eval_loss"])


def optimum(lrs: Sequence[float], losses: Sequence[float | None]) -> dict[str, Any]:
    """{lr_opt, loss_opt, at_edge, edge ("low" | "high" | None), method, diverged} from one size's scan.
    A None or non-finite loss is a diverged run (listed in `diverged`, ascending); when every rate diverged,
    lr_opt and loss_opt are None and the optimum is at the low edge (method "diverged")."""
    pts = sorted((float(lr), math.inf if loss is None or not math.isfinite(loss) else float(loss))
                 for lr, loss in zip(lrs, losses))
    if len(pts) < 3:
        raise ConfigError(f"an LR scan needs at least 3 finished or diverged points per size, got {len(pts)}")
    bad = [lr for lr, y in pts if math.isinf(y)]
    if len(bad) == len(pts):
        return {"lr_opt": None, "loss_opt": None, "at_edge": True, "edge": "low", "method": "diverged",
                "diverged": bad}
    x = np.log([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    i = int(np.argmin(y))
    if i in (0, len(pts) - 1):
        return {"lr_opt": pts[i][0], "loss_opt": pts[i][1], "at_edge": True,
                "edge": "low" if i == 0 else "high", "method": "edge", "diverged": bad}
    if math.isinf(y[i - 1]) or math.isinf(y[i + 1]):  # bracketed by a diverged neighbour: no parabola
        return {"lr_opt": pts[i][0], "loss_opt": pts[i][1], "at_edge": False, "edge": None, "method": "best",
                "diverged": bad}
    a, b, c = np.polyfit(x[i - 1:i + 2], y[i - 1:i + 2], 2)
    if a <= 0:  # three points cannot be convex with the middle one lowest; guard against ties
        return {"lr_opt": pts[i][0], "loss_opt": pts[i][1], "at_edge": False, "edge": None, "method": "best",
                "diverged": bad}
    x_opt = float(np.clip(-b / (2 * a), x[i - 1], x[i + 1]))
    return {"lr_opt": math.exp(x_opt), "loss_opt": float(np.polyval([a, b, c], x_opt)), "at_edge": False,
            "edge": None, "method": "parabola", "diverged": bad}


def fit_power_law(sizes: Sequence[float], lr_opts: Sequence[float], exponent: float | None = None) -> tuple[float, float]:
    """(c, k) of lr_opt = c · N^k, least squares in log–log; with `exponent`, k is held there and only c fitted
    (the geometric mean of lr_opt / N^k), which one size can do."""
    if exponent is not None:
        if not sizes:
            raise ConfigError("fitting lr_opt = c·N^k needs an optimum at 1 or more sizes")
        log_c = float(np.mean(np.log(lr_opts) - exponent * np.log(sizes)))
        return float(math.exp(log_c)), float(exponent)
    if len(sizes) < 2:
        raise ConfigError("fitting lr_opt = c·N^k needs optima at 2 or more sizes")
    k, log_c = np.polyfit(np.log(sizes), np.log(lr_opts), 1)
    return float(math.exp(log_c)), float(k)


def analyze(rows: Sequence[dict[str, Any]], param_count: str = "total", exponent: float | None = None) -> dict[str, Any]:
    """The lr_fit.json object from results rows (run_id, params, params_non_embedding, learning_rate, eval_loss,
    status, error); `exponent`: k held fixed (see fit_power_law). Diverged runs count as worse than every finite
    one (each size's `diverged` lists their rates, and a warning names them); runs that failed otherwise are left
    out (a warning names them); a size with fewer than 3 observed rates is left out of the fit."""
    key = "params" if param_count == "total" else "params_non_embedding"
    groups: dict[int, list[dict]] = {}
    lost: list[str] = []
    for r in rows:
        if observed(r):
            groups.setdefault(int(r[key]), []).append(r)
        elif r.get("status") == "failed":
            lost.append(r["run_id"])
    sizes, warnings = [], []
    if lost:
        warnings.append(f"{len(lost)} runs failed without diverging and are left out ({', '.join(lost)}); "
                        "--retry_failed trains them again")
    for n, group in sorted(groups.items()):
        shape = f"d{group[0].get('d_model')}-L{group[0].get('num_layers')}"
        if len(group) < 3:
            warnings.append(f"{shape} (N={n:,}): only {len(group)} observed learning rates; left out")
            continue
        opt = optimum([r["learning_rate"] for r in group], [loss_of(r) for r in group])
        if opt["diverged"]:
            warnings.append(f"{shape} (N={n:,}): diverged at learning rate "
                            f"{', '.join(f'{lr:.3g}' for lr in opt['diverged'])} (counted as worse than every "
                            "finite rate)")
        if opt["lr_opt"] is None:
            warnings.append(f"{shape} (N={n:,}): every learning rate diverged; no optimum; lower "
                            "sweep.lr_scan.lr_min")
        elif opt["at_edge"]:
            warnings.append(f"{shape} (N={n:,}): the best learning rate {opt['lr_opt']:.3g} is at the "
                            f"{opt['edge']} edge of the scan; extend sweep.lr_scan.lr_{'min' if opt['edge'] == 'low' else 'max'}")
        sizes.append({"size": n, "shape": shape, **opt,
                      "points": [{"learning_rate": r["learning_rate"],
                                  "eval_loss": None if diverged(r) else r["eval_loss"], "diverged": diverged(r)}
                                 for r in sorted(group, key=lambda r: r["learning_rate"])]})
    found = [s for s in sizes if s["lr_opt"] is not None]
    inside = [s for s in found if not s["at_edge"]]
    used = inside if len(inside) >= (1 if exponent is not None else 2) else found
    if len(used) < len(sizes):
        warnings.append(f"fit uses the {len(used)} sizes whose optimum is bracketed by the scan")
    c, k = fit_power_law([s["size"] for s in used], [s["lr_opt"] for s in used], exponent)
    return {"coefficient": c, "exponent": k, "exponent_fitted": exponent is None, "param_count": param_count,
            "formula": "lr_opt = coefficient * N**exponent", "num_rows": len(rows),
            "diverged": [{"size": s["size"], "shape": s["shape"], "learning_rates": s["diverged"]}
                         for s in sizes if s["diverged"]],
            "sizes": sizes, "fit_sizes": [s["size"] for s in used], "warnings": warnings}


def draw(ax: Any, fit: dict[str, Any], title: str | None = None) -> None:
    """One scan on a matplotlib axis: eval loss against peak learning rate per size, each optimum a star
    (hollow when at the scan's edge)."""
    for s in fit["sizes"]:
        fine = [p for p in s["points"] if not p.get("diverged")]
        line, = ax.plot([p["learning_rate"] for p in fine], [p["eval_loss"] for p in fine], "o-",
                        label=f"{s['shape']} (N={s['size']:,})")
        if s.get("diverged") and fine:  # diverged rates: a cross above the size's worst finite loss
            ax.plot(s["diverged"], [max(p["eval_loss"] for p in fine)] * len(s["diverged"]), "x", ms=9,
                    color=line.get_color())
        if s["lr_opt"] is not None:
            ax.plot([s["lr_opt"]], [s["loss_opt"]], "*", ms=12, color=line.get_color(),
                    mfc="none" if s["at_edge"] else line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("eval loss")
    fitted = f"lr_opt = {fit['coefficient']:.3g}·N^{fit['exponent']:.3f}"
    ax.set_title(f"{title}: {fitted}" if title else f"LR scan: {fitted}")
    ax.legend(fontsize=8)


def plot(fit: dict[str, Any], path: str) -> None:
    """Eval loss against peak learning rate per size, with each optimum marked."""
    plot_panels([fit], [None], path)


def plot_panels(fits: Sequence[dict[str, Any]], titles: Sequence[str | None], path: str) -> None:
    """Several scans side by side, one panel each, sharing the loss axis (e.g. SP | μP); with more than one
    scan, a last panel draws each scan's optimal learning rate against N with its fit lr_opt = c·N^k."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(fits) + (len(fits) > 1)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4), squeeze=False)
    for i, (fit, title) in enumerate(zip(fits, titles)):
        draw(axes[0, i], fit, title)
        if i:
            axes[0, i].sharey(axes[0, 0])
    if len(fits) > 1:
        ax = axes[0, -1]
        for fit, title in zip(fits, titles):
            found = [s for s in fit["sizes"] if s["lr_opt"] is not None]
            sizes = np.array([s["size"] for s in found], float)
            line, = ax.plot(sizes, [s["lr_opt"] for s in found], "*", ms=12,
                            label=f"{title}: lr_opt ∝ N^{fit['exponent']:.2f}")
            ax.plot(sizes, fit["coefficient"] * sizes ** fit["exponent"], "-", color=line.get_color())
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters N")
        ax.set_ylabel("optimal peak learning rate")
        ax.set_title("optimal learning rate against size")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_lr_fit(sweep_dir: str, rows: Sequence[dict[str, Any]], param_count: str = "total") -> dict[str, Any]:
    """Analyses the scan's rows; writes DIR/lr_fit.json and DIR/lr_scan.png; returns the fit."""
    fit = analyze(rows, param_count)
    files.write_json(os.path.join(sweep_dir, "lr_fit.json"), fit)
    plot(fit, os.path.join(sweep_dir, "lr_scan.png"))
    return fit
