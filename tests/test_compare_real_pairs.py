"""experiments.compare on pairs like real ones (issue 34, 1.1: it crashed on the first real pair, math.isfinite(None)
on frontier draws holding nulls, and wrote nothing): fits whose frontier draws partly failed, budgets without an
interior minimum, a variant worse than the baseline; compare.json and a compare.png whose title fits are written."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_compare import write_sweep_dir
from transformer.scaling import compare, compare_plots

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Four budgets 1.3x apart with 3% noise: some budgets lose their interior minimum, the minima do not pin E
# (held at approach 3's), and with E held some of the frontier's noise draws fail (null draws).
CLOSE_BUDGETS = (1e12, 1.3e12, 1.7e12, 2.2e12)


def noisy_pair(tmp_path, m: float) -> tuple[str, str]:
    base, var = str(tmp_path / "base"), str(tmp_path / "var")
    write_sweep_dir(base, sigma=0.03, budgets=CLOSE_BUDGETS, seed=0)
    write_sweep_dir(var, m=m, sigma=0.03, budgets=CLOSE_BUDGETS, seed=0)
    return base, var


def test_compare_writes_its_result_for_fits_with_failed_draws_excluded_budgets_and_a_worse_variant(tmp_path):
    base, var = noisy_pair(tmp_path, m=0.5)  # the variant needs twice the compute: worse
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "experiments.compare", f"--baseline={base}", f"--variant={var}",
                           f"--out={out}", "--bootstrap=40"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "compare.json").read_text())
    fits = result["fits"]
    draws = [x for role in fits.values() for x in role["frontier"].get("draws", {}).get("E", [])]
    assert None in draws  # the case that crashed: some noise draws of a frontier failed
    assert any(role["approach2"]["budgets_excluded"] for role in fits.values())
    excluded = [rec for rec in result["budgets"] if any(m["loss_opt"] is None for m in rec["measured"].values())]
    assert excluded and all(rec["minima_difference"] is None for rec in excluded)
    assert all("reason" in m for rec in excluded for m in rec["measured"].values() if m["loss_opt"] is None)
    with_ci = [rec for rec in result["budgets"] + [result["extrapolated"]] if rec.get("compute_multiplier_ci95")]
    assert with_ci and all(rec["compute_multiplier_ci95_source"] == "seeds" for rec in with_ci)
    assert "compute multiplier" in proc.stdout and (out / "compare.png").exists()


def test_compare_summary_and_figure_for_a_variant_that_is_worse(tmp_path):
    base, var = noisy_pair(tmp_path, m=0.5)
    result = compare.compare(base, var, bootstrap=20)
    measured = [rec["compute_multiplier"] for rec in result["budgets"] if rec.get("compute_multiplier") is not None]
    assert measured and max(measured) < 1  # worse at every measured budget
    json.dumps(result, allow_nan=False)
    compare_plots.plot_compare(result, str(tmp_path / "compare.png"))
    assert "baseline better" in compare_plots._title(result) or "no clear difference" in compare_plots._title(result)


def test_the_compare_title_fits_inside_the_figure():
    """issue 34, section 5: compare.png's two-line title was clipped at both sides when the counts ran long."""
    result = {"budgets": [{"flops": 1e12 * 1.3**i, "compute_multiplier": m, "compute_multiplier_ci95": ci}
                          for i, (m, ci) in enumerate([(0.72, [0.4, 1.3]), (0.61, [0.3, 0.9]), (0.55, [0.2, 0.8]),
                                                       (0.43, [0.1, 0.7])])],
              "extrapolated": {"flops": 8.8e12, "compute_multiplier": 0.11, "compute_multiplier_ci95": [0.0004, 0.22],
                               "at_flops_from": "default: 4x the largest budget"},
              "grid": {"budgets": [1e12 * 1.3**i for i in range(4)]}, "options": {"at_flops": 8.8e12},
              "fits": {role: {"frontier": {"law": None}, "approach2": {"budgets": []}}
                       for role in ("baseline", "variant")}}
    assert len(compare_plots._title(result).split("\n")[0]) > 90  # longer than the figure is wide at fontsize 10
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = compare_plots.draw(result)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    title = fig.axes[0].title
    box, page = title.get_window_extent(canvas.get_renderer()), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1, (box, page)
    assert "[0.0004, 0.22]" in title.get_text()  # a small interval end keeps its digits
