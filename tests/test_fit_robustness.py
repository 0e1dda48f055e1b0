"""Robustness of the fit's inputs: row order, extra columns, near-duplicate model sizes, plots of any fit."""
from __future__ import annotations

import numpy as np
import pytest

from transformer.scaling import isoflop, plots, predict
from transformer.scaling import points as points_lib


def grid(seed: int = 0, sizes: int = 7) -> tuple[np.ndarray, ...]:
    """A 6-budget IsoFLOP grid of L = 1.8 + 400/N^0.34 + 2000/D^0.37 with 0.3% noise: (N, D, C, loss)."""
    rng = np.random.default_rng(seed)
    n, c = [], []
    for flops in np.geomspace(1e18, 1e18 * 2**5, 6):
        n_opt = (0.34 * 400 / (0.37 * 2000)) ** (1 / 0.71) * (flops / 6) ** (0.37 / 0.71)  # the law's optimum
        n.extend(n_opt * np.logspace(-0.6, 0.6, sizes))
        c.extend([flops] * sizes)
    n, c = np.array(n), np.array(c)
    d = c / (6 * n)
    return n, d, c, (1.8 + 400 / n**0.34 + 2000 / d**0.37) * np.exp(rng.normal(0, 0.003, len(n)))


def write_csv(path, header, rows) -> str:
    with open(path, "w") as f:
        f.write(",".join(header) + "\n")
        f.writelines(",".join(str(v) for v in row) + "\n" for row in rows)
    return str(path)


def test_prediction_is_independent_of_row_order():
    n, d, c, loss = grid()
    order = np.random.default_rng(1).permutation(len(n))
    a = predict.frontier_predictions(points_lib.from_arrays(n, d, loss, flops=c), [2e20], samples=20)
    b = predict.frontier_predictions(points_lib.from_arrays(n[order], d[order], loss[order], flops=c[order],
                                                            ids=[f"p{i}" for i in order]), [2e20], samples=20)
    assert a["predictions"][0]["loss"] == b["predictions"][0]["loss"]
    assert a["predictions"][0]["loss_ci95"] == b["predictions"][0]["loss_ci95"]


def test_a_model_name_column_is_ignored_but_a_setting_column_is_not(tmp_path):
    n, d, c, loss = grid()
    names = {v: f"model-{i}" for i, v in enumerate(sorted(set(np.round(n))))}
    rows = [(names[np.round(ni)], ni, di, ci, li) for ni, di, ci, li in zip(n, d, c, loss)]
    pts = points_lib.read_csv(write_csv(tmp_path / "curves.csv", ["model", "params", "tokens", "flops", "loss"], rows))
    assert len(pts) == len(n)
    mixed = rows + [("other", ni, di, ci, li * 1.1) for _, ni, di, ci, li in rows]
    path = write_csv(tmp_path / "mixed.csv", ["setting", "params", "tokens", "flops", "loss"],
                     [("a",) + r[1:] for r in rows] + [("b",) + r[1:] for r in mixed[len(rows):]])
    with pytest.raises(ValueError, match="mix 2 settings"):
        points_lib.read_csv(path)
    assert len(points_lib.read_csv(path, where={"setting": "b"})) == len(n)


def test_near_duplicate_sizes_do_not_explode_the_draws():
    """Each size sampled twice at N and N·1.001 (a digitised figure): the minima's draws stay near the
    minimum instead of spiking between the near-equal sizes."""
    n, d, c, loss = grid(sizes=6)
    rng = np.random.default_rng(3)
    n2 = np.concatenate([n, n * 1.001])
    c2 = np.concatenate([c, c])
    loss2 = np.concatenate([loss, loss * np.exp(rng.normal(0, 0.004, len(loss)))])
    pts = points_lib.from_arrays(n2, c2 / (6 * n2), loss2, flops=c2)
    groups = isoflop.group_budgets(pts.flops_P)
    assert all(len(isoflop.sizes(pts, g)["log_n"]) == 6 for g in groups)
    pred = predict.frontier_predictions(pts, [1e20], samples=30)["predictions"][0]
    lo, hi = pred["loss_noise_ci95"]
    assert 0.97 * pred["loss"] < lo < pred["loss"] < hi < 1.03 * pred["loss"]


def test_plots_draw_an_interval_that_misses_its_value(tmp_path):
    fit = {"points": [{"params": 1e6, "tokens": 1e8, "flops": 6e14, "loss": 3.0}],
           "approach1": {}, "approach2": {}, "approach3": {}, "frontier": {}, "headline": {"convention": "given"},
           "predictions": [{"flops": 1e16, "params": 2e6, "params_ci95": [2.1e6, 3e6], "tokens": 1e9,
                            "tokens_ci95": [5e8, 9e8], "loss": 2.5, "loss_ci95": [2.6, 2.7]}]}
    assert plots.plot_frontier(fit, str(tmp_path / "f.png"))
    assert plots.plot_optimal(fit, str(tmp_path / "o.png"))


def test_approach1_does_not_fit_inner_points_of_one_budget():
    """The gpu_quick sweep's CPU run (issue 30): the loss envelope's only inner points were two sizes of the largest
    budget, 1.99894e11 and 1.99979e11 FLOPs apart by the rounding of steps; the power law through them had a = -1089
    and N_coef = inf, which fit.json cannot hold (the sweep stopped with a traceback after its grid). Approach 1
    now says why it does not fit; approach 2 is unaffected."""
    from transformer.scaling import fits
    params = [15088, 30120, 50144, 72280] * 3  # the 12 grid runs' rows (results.jsonl) of that sweep
    tokens = [394240, 212992, 134144, 95232, 789504, 425984, 268288, 190464, 1577984, 850944, 535552, 381952]
    flops = [49958092800.0, 50054823936.0, 50068979712.0, 49916805120.0, 100045946880.0, 100109647872.0,
             100137959424.0, 99833610240.0, 199962132480.0, 199978647552.0, 199893712896.0, 200203960320.0]
    loss = [3.1821, 3.4066, 3.5868, 3.7884, 2.9832, 3.0054, 3.1282, 3.3647, 2.8189, 2.6998, 2.7011, 2.8835]
    out = fits.approach1(points_lib.from_arrays(params, tokens, loss, flops=flops))
    assert out["a"] is None and "span less than" in out["note"]
