"""Approach 2 with its defaults against Porian et al. 2024's 15 published exponents (their IsoFLOP points,
shipped in experiments/reference_data), and the loss-noise intervals against theirs."""
from __future__ import annotations

import csv
import os

import numpy as np
import pytest

from transformer.scaling import fits, noise
from transformer.scaling import points as points_lib

REFERENCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments",
                         "reference_data")
POINTS = os.path.join(REFERENCE, "porian2024_isoflop_points.csv")
SETTING = ("dataset", "experiment", "hparams", "warmup", "decay", "param_count", "loss_type")


def published() -> list[dict[str, str]]:
    with open(os.path.join(REFERENCE, "porian2024_exponents.csv")) as f:
        return list(csv.DictReader(f))


def setting_points(row: dict[str, str]) -> points_lib.Points:
    return points_lib.read_csv(POINTS, where={k: row[k] for k in SETTING})


def _id(row: dict[str, str]) -> str:
    return f"{row['dataset']}: {row['experiment']}"


@pytest.mark.parametrize("row", published(), ids=_id)
def test_default_approach2_recovers_published_exponent(row):
    res = fits.approach2(setting_points(row))  # no flags: the defaults
    assert res["method"] == "akima"
    assert res["a"] == pytest.approx(float(row["a"]), abs=0.03)
    assert res["a"] + res["b"] == pytest.approx(1.0, abs=1e-6)  # C = 6·N·D in these points


def test_noise_intervals_cover_published_exponents_and_are_not_much_wider():
    covered, ratios = 0, []
    for k, row in enumerate(published()):
        pts = setting_points(row)
        res = fits.approach2(pts)
        sigma = noise.estimate(pts)
        assert "residuals" in sigma["source"]  # these points have no seed replicates
        draws = fits.approach2_draws(res, sigma["sigma"], 150, np.random.default_rng(k))
        lo, hi = np.percentile(draws["a"], [2.5, 97.5])
        covered += lo <= float(row["a"]) <= hi
        ratios.append((hi - lo) / (float(row["a_ci95_hi"]) - float(row["a_ci95_lo"])))
    assert covered >= 14, covered
    assert 0.7 <= np.median(ratios) <= 2.0, ratios


def test_where_filter_and_aliases(tmp_path):
    row = published()[0]
    pts = setting_points(row)
    assert len(pts) == 107 and "experiment=Reproducing Kaplan et al." in pts.source
    with pytest.raises(ValueError, match=r"mix 15 settings.*dataset=RefinedWeb,experiment=Cosine decay"):
        points_lib.read_csv(POINTS)
    with pytest.raises(ValueError, match=r"no rows match --where experiment=Nope.*15 setting"):
        points_lib.read_csv(POINTS, where={"experiment": "Nope"})
    with pytest.raises(ValueError, match="column 'colour'"):
        points_lib.read_csv(POINTS, where={"colour": "red"})
    assert points_lib.parse_where(["experiment=Optimizer tuning, no decay (attention FLOPs)"]) == {
        "experiment": "Optimizer tuning, no decay (attention FLOPs)"}
