"""Scaling-law fits: recovery of known exponents, the published Chinchilla replication, inputs, CLI."""
import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from transformer.scaling import fits, parametric
from transformer.scaling import points as points_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(REPO, "experiments", "reference_data")

# The true law of the synthetic points: L(N, D) = E + A/N^α + B/D^β.
E, A, B, ALPHA, BETA = 1.8, 400.0, 2000.0, 0.34, 0.37
TRUE_A = BETA / (ALPHA + BETA)  # 0.5211
G = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
BUDGETS = np.geomspace(1e18, 1e21, 5)


def true_loss(n, d):
    return E + A / np.power(n, ALPHA) + B / np.power(d, BETA)


def isoflop_grid(budgets=BUDGETS, sizes=7, spread=1.0, noise=0.002, seed=0):
    """`sizes` model sizes per budget, log-spaced ±`spread` decades around the true N_opt."""
    rng = np.random.default_rng(seed)
    n, c = [], []
    for flops in budgets:
        n_opt = G * (flops / 6) ** TRUE_A
        n.extend(n_opt * np.logspace(-spread, spread, sizes))
        c.extend([flops] * sizes)
    n, c = np.array(n), np.array(c)
    d = c / (6 * n)
    loss = true_loss(n, d) * np.exp(rng.normal(0, noise, len(n)))
    return n, d, c, loss


def chinchilla_points():
    return points_lib.read_csv(os.path.join(REFERENCE, "chinchilla_hoffmann2022.csv"))


# ---------------------------------------------------------------- recovery of known exponents


def test_approach3_recovers_known_law():
    n, d, c, loss = isoflop_grid()
    res = fits.approach3(points_lib.from_arrays(n, d, loss, flops=c))
    assert res["alpha"] == pytest.approx(ALPHA, abs=0.02)
    assert res["beta"] == pytest.approx(BETA, abs=0.02)
    assert res["E"] == pytest.approx(E, abs=0.03)
    assert res["a"] == pytest.approx(TRUE_A, abs=0.01)
    assert res["a"] + res["b"] == pytest.approx(1.0)
    flops = 1e20  # N_opt = G·(C/6)^a agrees with the true law's optimum
    assert res["N_coef"] * flops ** res["a"] == pytest.approx(G * (flops / 6) ** TRUE_A, rel=0.15)


def test_approach3_noise_free_is_exact():
    n, d, c, loss = isoflop_grid(noise=0.0)
    fit = parametric.fit_loss(n, d, loss)
    assert fit.alpha == pytest.approx(ALPHA, abs=2e-3)
    assert fit.beta == pytest.approx(BETA, abs=2e-3)
    assert fit.E == pytest.approx(E, abs=5e-3)
    assert fit.G == pytest.approx(G, rel=0.05)


def test_approach2_recovers_known_exponents():
    n, d, c, loss = isoflop_grid()
    res = fits.approach2(points_lib.from_arrays(n, d, loss, flops=c))
    assert len(res["budgets"]) == 5 and not res["budgets_excluded"]
    assert res["a"] == pytest.approx(TRUE_A, abs=0.02)
    assert res["b"] == pytest.approx(1 - TRUE_A, abs=0.02)
    for budget in res["budgets"]:  # D_opt = C/(6·N_opt) when C = 6ND
        assert budget["D_opt"] == pytest.approx(budget["flops"] / (6 * budget["N_opt"]), rel=1e-6)


def test_approach2_groups_budgets_despite_float_rounding():
    n, d, c, loss = isoflop_grid()
    c = c * (1 + np.random.default_rng(1).uniform(-0.003, 0.003, len(c)))
    res = fits.approach2(points_lib.from_arrays(n, d, loss, flops=c))
    assert len(res["budgets"]) == 5
    assert all(len(b["ids"]) == 7 for b in res["budgets"])


def test_approach2_drops_budget_whose_minimum_is_at_an_edge():
    n, d, c, loss = isoflop_grid()
    flops = 3e21  # sizes far below this budget's optimum: loss falls monotonically with N
    n_edge = G * (flops / 6) ** TRUE_A * np.logspace(-2.5, -1.5, 5)
    n_all = np.concatenate([n, n_edge])
    c_all = np.concatenate([c, np.full(5, flops)])
    d_all = c_all / (6 * n_all)
    res = fits.approach2(points_lib.from_arrays(n_all, d_all, true_loss(n_all, d_all), flops=c_all))
    (dropped,) = res["budgets_excluded"]
    assert dropped["flops"] == pytest.approx(flops)
    assert "smallest or largest" in dropped["reason"]
    excluded_ids = {e["id"] for e in res["points_excluded"]}
    assert len(excluded_ids) == 5 and not excluded_ids & set(res["points_used"])
    assert res["a"] == pytest.approx(TRUE_A, abs=0.02)


def test_approach1_final_points_envelope():
    n, d, c, loss = isoflop_grid(noise=0.0)
    res = fits.approach1(points_lib.from_arrays(n, d, loss, flops=c))
    assert res["envelope_from"] == "final points"
    assert len(res["envelope"]["flops"]) == 5  # one frontier point per budget: its best size
    assert res["a"] == pytest.approx(TRUE_A, abs=0.01)


# ---------------------------------------------------------------- sweep directories


def write_sweep(root, sizes, tokens_final, extra=()):
    """A sweep directory: results.jsonl + per-run metrics.jsonl curves of the true law."""
    os.makedirs(os.path.join(root, "runs"), exist_ok=True)
    with open(os.path.join(root, "results.jsonl"), "w") as results:
        for i, (n, d_end) in enumerate(zip(sizes, tokens_final)):
            run_id = f"run{i:02d}"
            tokens = np.geomspace(d_end / 3000, d_end, 40)
            os.makedirs(os.path.join(root, "runs", run_id))
            with open(os.path.join(root, "runs", run_id, "metrics.jsonl"), "w") as m:
                for step, t in enumerate(tokens):
                    row = {"step": step, "tokens": t, "flops": 6 * n * t, "train_loss": true_loss(n, t)}
                    if step % 2 == 1 or step == len(tokens) - 1:
                        row["eval_loss"] = true_loss(n, t)
                    m.write(json.dumps(row) + "\n")
            results.write(json.dumps({
                "run_id": run_id, "params": n, "params_non_embedding": 0.8 * n, "tokens": d_end,
                "flops": 6 * n * d_end, "eval_loss": true_loss(n, d_end), "status": "ok",
                "d_model": 64, "num_layers": 2}) + "\n")
        for record in extra:
            results.write(json.dumps(record) + "\n")


def test_sweep_curves_drive_approach1(tmp_path):
    sizes = np.geomspace(1e7, 3e9, 16)
    write_sweep(str(tmp_path), sizes, np.full(16, 3e11))
    pts = points_lib.read_sweep(str(tmp_path))
    assert len(pts.curves) == 16
    res = fits.approach1(pts)
    assert res["envelope_from"] == "loss curves"
    assert res["a"] == pytest.approx(TRUE_A, abs=0.03)
    assert res["b"] == pytest.approx(1 - TRUE_A, abs=0.03)


def test_sweep_excludes_failed_and_nonfinite_runs(tmp_path):
    bad = [
        {"run_id": "failed", "params": 1e8, "params_non_embedding": 8e7, "tokens": 1e9, "flops": 6e17,
         "eval_loss": 3.0, "status": "failed"},
        {"run_id": "diverged", "params": 1e8, "params_non_embedding": 8e7, "tokens": 1e9, "flops": 6e17,
         "eval_loss": float("nan"), "status": "ok"},
    ]
    write_sweep(str(tmp_path), [1e7, 1e8], [1e9, 1e9], extra=bad)
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write('{"run_id": "torn", "params": 1e8, "tok')  # a writer killed mid-line
    pts = points_lib.read_sweep(str(tmp_path), n_kind="params_non_embedding")
    assert pts.ids == ("run00", "run01")
    np.testing.assert_allclose(pts.params_P, [8e6, 8e7])
    reasons = {e["id"]: e["reason"] for e in pts.excluded}
    assert "status='failed'" in reasons["failed"] and "not finite" in reasons["diverged"]
    assert "torn" in reasons["line5"]
    with pytest.raises(ValueError, match="n_kind"):
        points_lib.read_sweep(str(tmp_path), n_kind="embedding")


# ---------------------------------------------------------------- published data


def test_chinchilla_approach3_reproduces_epoch_ai():
    """Besiroglu et al. 2024: 5 highest losses dropped, Huber δ=1e-3 summed → E 1.817, α .347, β .367."""
    fit = fits.fit_all(chinchilla_points(), drop_highest=5, approach3_near=0)  # all points, as Epoch AI
    a3 = fit["approach3"]
    assert len(a3["points_used"]) == 240 and len(fit["points_excluded"]) == 5
    assert a3["E"] == pytest.approx(1.817, abs=0.02)
    assert a3["alpha"] == pytest.approx(0.347, abs=0.01)
    assert a3["beta"] == pytest.approx(0.367, abs=0.01)
    assert a3["a"] == pytest.approx(0.513, abs=0.01)


def test_chinchilla_outliers_move_beta_up():
    a3 = fits.approach3(chinchilla_points())
    assert a3["beta"] == pytest.approx(0.45, abs=0.02)
    assert a3["alpha"] == pytest.approx(0.35, abs=0.02)


def test_porian_approach2_matches_published_exponent():
    """Porian et al. 2024, RefinedWeb, tuned optimizer, no decay: a = 0.4969 [0.4907, 0.5045]."""
    setting = ("RefinedWeb", "Optimizer tuning (no decay)")
    with open(os.path.join(REFERENCE, "porian2024_isoflop_points.csv")) as f:
        rows = [r for r in csv.DictReader(f) if (r["dataset"], r["experiment"]) == setting]
    pts = points_lib.from_arrays(*([float(r[k]) for r in rows] for k in ("N", "D", "loss")),
                                 flops=[float(r["flops"]) for r in rows])
    local = fits.approach2(pts, window=1)  # a parabola through the 3 sizes around each minimum
    assert 0.4907 <= local["a"] <= 0.5045
    assert fits.approach2(pts, method="parabola")["a"] > 0.5045  # one parabola through all sizes: biased up
    assert fits.approach1(pts)["a"] == pytest.approx(0.4969, abs=0.02)


# ---------------------------------------------------------------- options, inputs, CLI


def test_drop_highest_and_bootstrap_are_recorded_and_seeded():
    n, d, c, loss = isoflop_grid()
    pts = points_lib.from_arrays(n, d, loss, flops=c)
    first = fits.fit_all(pts, drop_highest=2, bootstrap=4, seed=3)
    worst = set(np.array(pts.ids)[np.argsort(loss)[-2:]])
    assert {e["id"] for e in first["points_excluded"]} == worst
    assert worst.isdisjoint(first["approach3"]["points_used"])
    for name, keys in (("approach2", ("a", "b")), ("approach3", ("a", "b", "alpha", "beta", "E"))):
        for key in keys:
            lo, hi = first[name][f"{key}_ci95"]
            assert lo <= hi and lo - 0.05 <= first[name][key] <= hi + 0.05
    again = fits.fit_all(pts, drop_highest=2, bootstrap=4, seed=3)
    assert again["approach3"]["alpha_ci95"] == first["approach3"]["alpha_ci95"]
    with pytest.raises(ValueError, match="drop_highest"):
        fits.fit_all(pts, drop_highest=len(pts))


def test_too_few_budgets_gives_a_note_not_a_crash():
    n, d, c, loss = isoflop_grid(budgets=BUDGETS[:1])
    fit = fits.fit_all(points_lib.from_arrays(n, d, loss, flops=c))
    assert fit["approach2"]["a"] is None and "at least 2" in fit["approach2"]["note"]
    assert fit["approach3"]["a"] is not None


def test_degenerate_bootstrap_resamples_do_not_crash_the_fit():
    """Six points of a tiny test sweep (two budgets, losses ~3.5, nearly flat in N and D): some bootstrap
    resamples fit β·B = 0, where G = (αA/(βB))^(1/(α+β)) is undefined. This crashed the sweep's closing fit
    with ZeroDivisionError; such resamples now carry G = NaN and the fit completes."""
    params = np.array([3216, 7968, 7968, 22080, 14256, 31440], float)
    tokens = np.array([49664, 20224, 60672, 7424, 34048, 15616], float)
    loss = np.array([3.5863175, 3.4661784, 3.4671280, 3.7425053, 3.5672562, 3.4167860])
    flops = np.array([1e9, 1e9, 3e9, 1e9, 3e9, 3e9])
    fit = fits.fit_all(points_lib.from_arrays(params, tokens, loss, flops=flops), bootstrap=200)
    assert fit["approach3"]["a"] is not None
    assert np.isnan(parametric.LossFit(E=1.0, A=1.0, B=0.0, alpha=0.3, beta=0.3, objective=0.0).G)


def write_csv(path, header, rows):
    with open(path, "w") as f:
        f.write(",".join(header) + "\n")
        for r in rows:
            f.write(",".join(str(x) for x in r) + "\n")


def test_csv_errors_name_file_column_and_row(tmp_path):
    path = str(tmp_path / "p.csv")
    write_csv(path, ["params", "tokens"], [[1e8, 1e9]])
    with pytest.raises(ValueError, match=r"p\.csv: column 'loss' is missing.*params \(or N\), tokens \(or D\), loss"):
        points_lib.read_csv(path)
    write_csv(path, ["params", "tokens", "loss"], [[1e8, 1e9, 3.0], [1e8, 0, 3.0]])
    with pytest.raises(ValueError, match=r"p\.csv: row 3, column 'tokens' = '0' is not a positive"):
        points_lib.read_csv(path)
    write_csv(path, ["params", "tokens", "loss"], [[1e8, 1e9, "abc"]])
    with pytest.raises(ValueError, match=r"row 2, column 'loss' = 'abc' is not a number"):
        points_lib.read_csv(path)
    write_csv(path, ["loss", "tokens", "params"], [[3.0, 1e9, 1e8]])  # column order is free
    pts = points_lib.read_csv(path)
    assert pts.flops_P[0] == pytest.approx(6e17)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "experiments.fit", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_writes_fit_json_and_figures(tmp_path):
    n, d, c, loss = isoflop_grid()
    csv_path = str(tmp_path / "points.csv")
    write_csv(csv_path, ["params", "tokens", "flops", "loss"], zip(n, d, c, loss))
    out = tmp_path / "fit"
    proc = run_cli(f"--points={csv_path}", f"--out={out}", "--bootstrap=3", "--drop_highest=1")
    assert proc.returncode == 0, proc.stderr
    assert "approach3: E =" in proc.stdout
    fit = json.loads((out / "fit.json").read_text())
    for name in ("approach1", "approach2", "approach3"):
        assert {"a", "b", "points_used", "points_excluded"} <= fit[name].keys()
    assert {"E", "A", "B", "alpha", "beta", "G", "a_ci95"} <= fit["approach3"].keys()
    assert fit["approach3"]["a"] == pytest.approx(TRUE_A, abs=0.02)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["backtest.png", "isoflops.png", "loss_contours.png", "loss_frontier.png", "optimal_scaling.png"]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


@pytest.mark.parametrize("args, message", [
    (["--points=/nonexistent/p.csv"], "no such points file"),
    (["--points=x.csv", "--sweep=y"], "exactly one of"),
    ([], "exactly one of"),
])
def test_cli_user_errors_exit_cleanly_and_write_nothing(tmp_path, args, message):
    out = tmp_path / "fit"
    proc = run_cli(*args, f"--out={out}")
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()
