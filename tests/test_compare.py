"""experiments.compare on synthetic sweeps of a known law: the variant's law is the baseline's at m times
the compute (N → √m·N, D → √m·D, so L_var_opt(C) = L_base_opt(m·C) exactly), and the compute multiplier
must come back as m, within its interval, at every budget and extrapolated."""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from matplotlib import image

from sweep_fixture import TRUE_A, g_coef, law, shape
from transformer.spec import ConfigError
from transformer.scaling import compare, compare_plots, fits, frontier, interval

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


def pair(tmp_path, m: float, seed: int = 0, **variant) -> tuple[str, str]:
    """A baseline and a variant (the law at m times the compute) of one grid, with independent noise."""
    base, var = str(tmp_path / "base"), str(tmp_path / "var")
    write_sweep_dir(base, seed=100 + seed)
    write_sweep_dir(var, m=m, seed=200 + seed, **variant)
    return base, var


def contains(ci, x: float) -> bool:
    return ci[0] is not None and ci[0] <= x <= (math.inf if ci[1] is None else ci[1])


@pytest.mark.slow
def test_recovers_a_known_compute_multiplier_end_to_end(tmp_path):
    """m = 2: the multiplier is 2 within its interval at every budget and at 4x the largest, the interval
    excludes 1 inside the grid, the variant's losses are lower; compare.json and compare.png are written."""
    base, var = pair(tmp_path, m=2.0)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "experiments.compare", f"--baseline={base}", f"--variant={var}",
                           f"--out={out}", "--bootstrap=40"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "compare.json").read_text())
    assert [r["flops"] for r in result["budgets"]] == list(BUDGETS)
    ext = result["extrapolated"]
    assert ext["flops"] == 4 * max(BUDGETS) and "4x the largest budget" in ext["at_flops_from"]
    for rec in result["budgets"] + [ext]:
        assert contains(rec["compute_multiplier_ci95"], 2.0), rec
        assert rec["loss_difference"] < 0 and rec["loss_difference_ci95"][1] < 0
    # at 4x the largest budget the estimate's ln error has sd 0.15 over 120 synthetic pairs (0.165 under the hard
    # test for E; docs/limitations.md): within 3 sd; inside the grid within 25%
    assert abs(math.log(ext["compute_multiplier"] / 2.0)) < 3 * 0.15, ext
    for rec in result["budgets"]:
        assert rec["compute_multiplier"] == pytest.approx(2.0, rel=0.25)
        assert rec["compute_multiplier_ci95"][0] > 1.2  # the improvement is resolved inside the grid
        assert rec["variant_better_fraction"] == 1.0
        measured = rec["measured"]
        difference = measured["variant"]["loss_opt"] - measured["baseline"]["loss_opt"]
        assert rec["minima_difference"] == pytest.approx(difference) and difference < 0
    for role in ("baseline", "variant"):
        a2 = result["fits"][role]["approach2"]
        # N_opt ∝ C^a: the shift √m in N and D leaves both exponents at the law's
        assert contains(a2["a_ci95"], TRUE_A) and contains(a2["b_ci95"], 1 - TRUE_A)
        assert result["fits"][role]["noise"]["source"].startswith("seed replicates")
    assert "C = 1.2e+14" in proc.stdout and "x [" in proc.stdout
    png = image.imread(out / "compare.png")
    assert png.shape[0] > 800 and png.shape[1] > 700


@pytest.mark.slow
def test_no_difference_gives_an_interval_containing_1(tmp_path):
    base, var = pair(tmp_path, m=1.0)
    result = compare.compare(base, var, bootstrap=40)
    for rec in result["budgets"] + [result["extrapolated"]]:
        assert contains(rec["compute_multiplier_ci95"], 1.0), rec
        assert contains(rec["loss_difference_ci95"], 0.0)
    # the same directory on both sides: independent noise draws, so the interval is not the point [1, 1]; the point
    # is 1 up to the soft test's weights, which use σ of the minima from each side's own draws (0.05% here)
    same = compare.compare(base, base, bootstrap=20)["budgets"][1]
    assert same["compute_multiplier"] == pytest.approx(1.0, rel=0.005)
    assert same["compute_multiplier_ci95"][0] < 0.97 and same["compute_multiplier_ci95"][1] > 1.03


def test_the_plot_title_reads_the_measured_budgets_before_the_extrapolation():
    """The measured budgets are the result (docs/comparing.md); the extrapolated multiplier is a direction."""
    result = {"budgets": [{"compute_multiplier": 1.32, "compute_multiplier_ci95": [1.24, 1.40]},
                          {"compute_multiplier": 1.05, "compute_multiplier_ci95": [0.90, 1.20]},
                          {"compute_multiplier": None, "compute_multiplier_ci95": None,
                           "note": "no frontier for the variant"}],
              "extrapolated": {"flops": 4e13, "compute_multiplier": 1.69, "compute_multiplier_ci95": [0.75, 6.64]}}
    measured, extrapolated = compare_plots._title(result).split("\n")
    assert "3 measured budgets: 1.05x to 1.32x" in measured
    assert "variant better at 1" in measured and "no clear difference at 1" in measured and "of 2" in measured
    assert extrapolated.endswith("4e+13 (extrapolated): 1.69x [0.75, 6.64], no clear difference")
    # a budget where the variant is below the baseline's E: the multiplier is infinite, the strongest "better"
    result["budgets"][2] = {"compute_multiplier": None, "compute_multiplier_ci95": [2.0, None],
                            "note": "infinite: the variant's L_opt is below the baseline's irreducible loss E"}
    measured = compare_plots._title(result).split("\n")[0]
    assert "1.05x to infinite" in measured and "variant better at 2" in measured and "of 3" in measured


@pytest.mark.slow
def test_multiplier_intervals_cover_the_true_multiplier():
    """20 synthetic pairs (m = 2, σ = 0.3%, 50 noise draws per sweep): the 95% interval covers m on at
    least 16 of 20 at every budget and at 4x the largest (measured: 18, 18, 16, 18 and 18 of 20; over 120 pairs
    92.5, 92.5, 91, 92 and 93%, about the 91% that 50 percentile draws give an exact bootstrap)."""
    import tempfile

    covered = np.zeros(len(BUDGETS) + 1)
    for seed in range(20):
        with tempfile.TemporaryDirectory() as d:
            base, var = pair(pathlib.Path(d), m=2.0, seed=seed)
            result = compare.compare(base, var, bootstrap=50, seed=seed)
        covered += [contains(r["compute_multiplier_ci95"], 2.0) for r in result["budgets"] + [result["extrapolated"]]]
    assert np.all(covered >= 16), covered


def test_multiplier_inverts_the_baseline_frontier():
    law_b = {"E": 1.5, "k": 300.0, "gamma": 0.2}
    flops = np.array([1e12, 1e14, 1e16])
    for m in (0.5, 3.0, 40.0):
        np.testing.assert_allclose(compare.multiplier(law_b, frontier.loss_at(law_b, m * flops), flops), m, rtol=1e-10)
    assert np.all(np.isinf(compare.multiplier(law_b, np.array([1.5, 1.2]), np.array([1e12, 1e12]))))
    # percentiles of draws with infinite values: an end among the infinite draws is infinite
    # (the finite end as numpy's percentile of the same order statistics, interval.PERCENTILE_METHOD)
    ends = interval.percentile_ends(np.array([1.0, 2.0, np.inf, np.nan]), keep_infinite=True)
    assert list(ends) == [pytest.approx(np.percentile([1, 2, 3], 2.5, method="weibull")), math.inf]
    assert interval.percentile_ends(np.r_[np.linspace(1, 2, 97), [np.inf] * 3], True)[1] == math.inf  # 3% infinite
    assert interval.percentile_ends(np.r_[np.linspace(1, 2, 99), np.inf], True)[1] < 2.0  # 1% infinite


@pytest.mark.slow
def test_variant_below_the_baseline_irreducible_loss_is_infinite(tmp_path):
    """A variant with a lower E (0.25 below): far out its loss falls below the baseline's E; the multiplier
    there is null with a note, not a number, and compare.json stays valid JSON."""
    base, var = pair(tmp_path, m=1.0, e_shift=-0.25)
    result = compare.compare(base, var, at_flops=1e20, bootstrap=20)
    ext = result["extrapolated"]
    law_b = result["fits"]["baseline"]["frontier"]["law"]
    assert ext["loss_variant"] < law_b["E"]
    assert ext["compute_multiplier"] is None and "infinite" in ext["note"] and "below the baseline" in ext["note"]
    assert ext["compute_multiplier_ci95"][1] is None and "upper end is infinite" in ext["note"]
    assert ext["at_flops_from"] == "--at_flops"
    assert all(r["compute_multiplier"] > 1 for r in result["budgets"])
    json.dumps(result, allow_nan=False)
    assert "C = 1e+20 (--at_flops): inf" in compare.summary(result)


@pytest.fixture
def no_fitting(monkeypatch):
    """Bad input must be refused before any fitting."""
    def refuse(*args, **kwargs):
        raise AssertionError("fit_all was called")
    monkeypatch.setattr(fits, "fit_all", refuse)


def test_grids_that_differ_are_refused_naming_the_differences(tmp_path, no_fitting):
    base, var = str(tmp_path / "base"), str(tmp_path / "var")
    write_sweep_dir(base)
    write_sweep_dir(var, budgets=(1e12, 3e12, 1e13, 1e14))
    with pytest.raises(ConfigError) as e:
        compare.compare(base, var)
    assert "not sweeps of the same grid" in str(e.value)
    assert "budgets only in the baseline: 3e+13" in str(e.value)
    assert "budgets only in the variant: 1e+14" in str(e.value)
    write_sweep_dir(var)
    doc = json.loads(open(os.path.join(var, "sweep.json")).read())
    first = doc["runs"][0]
    name = f"d{first['d_model']}-L{first['num_layers']}"
    doc["runs"] = [dict(r, d_model=512) if r["run_id"] == first["run_id"] else r for r in doc["runs"]]
    open(os.path.join(var, "sweep.json"), "w").write(json.dumps(doc))
    with pytest.raises(ConfigError, match=rf"budget 1e\+12: sizes only in the baseline: {name}; only in the "
                                          rf"variant: d512-L{first['num_layers']}"):
        compare.compare(base, var)


def test_unfinished_sweeps_are_refused_with_the_command_to_finish(tmp_path, no_fitting):
    base, var = pair(tmp_path, m=2.0, drop=3, failed=2)
    with pytest.raises(ConfigError) as e:
        compare.compare(base, var)
    text = str(e.value)
    total = len(json.loads(open(os.path.join(var, "sweep.json")).read())["runs"])
    assert f"--variant={var} is an unfinished sweep: 5 of {total} runs" in text
    assert "3 not recorded yet, 2 failed" in text and "--baseline" not in text
    assert f"--workdir={var} --run_index=I` for I in {total - 3},{total - 2},{total - 1}" in text
    assert "--retry_failed" in text and "sweep 'synthetic'" in text


def test_paths_that_are_not_sweep_dirs_are_refused(tmp_path, no_fitting):
    base, var = pair(tmp_path, m=2.0)
    with pytest.raises(ConfigError, match="no such directory"):
        compare.compare(base, str(tmp_path / "nope"))
    os.remove(os.path.join(base, "sweep.json"))
    with pytest.raises(ConfigError, match="--baseline=.* is not a sweep directory: it has no sweep.json"):
        compare.compare(base, var)
    write_sweep_dir(base)
    doc = json.loads(open(os.path.join(var, "sweep.json")).read())
    open(os.path.join(var, "sweep.json"), "w").write(json.dumps({**doc, "mode": "lr_scan"}))
    with pytest.raises(ConfigError, match="sweep.mode='lr_scan' sweep; compare needs two IsoFLOP sweeps"):
        compare.compare(base, var)
    with pytest.raises(ConfigError, match="at_flops=-1.0 is not valid"):
        compare.compare(base, base, at_flops=-1.0)


def test_cli_bad_input_is_one_error_line(tmp_path):
    base, var = pair(tmp_path, m=2.0, drop=1)
    proc = subprocess.run([sys.executable, "-m", "experiments.compare", f"--baseline={base}", f"--variant={var}",
                           f"--out={tmp_path / 'out'}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("error: --variant=")
    assert not (tmp_path / "out").exists()
