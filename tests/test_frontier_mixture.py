"""The frontier's soft test: predictions average the held-E and free-E laws with weights set by the χ² statistic
(`frontier.held_weight`), and everything that evaluates or inverts a frontier (`frontier.loss_at`,
`compare.multiplier`, the stored noise draws) follows the average."""
from __future__ import annotations

import numpy as np
import pytest

from transformer.scaling import compare, frontier, interval

FLOPS_B = np.geomspace(1e18, 1e21, 6)


def minima(e: float = 1.8, k: float = 400.0, gamma: float = 0.15, noise: float = 0.002, seed: int = 0) -> np.ndarray:
    """Six minima of E + k·C^-γ with log-normal noise."""
    rng = np.random.default_rng(seed)
    return (e + k * FLOPS_B ** -gamma) * np.exp(noise * rng.standard_normal(FLOPS_B.size))


def test_held_weight_is_a_half_at_the_threshold_and_falls_as_the_minima_reject_e():
    stats = np.array([-5.0, 0.0, frontier.E_TEST, 10.0, 40.0])
    w = np.array([frontier.held_weight(s) for s in stats])
    assert w[2] == pytest.approx(0.5)
    assert np.all(np.diff(w) < 0)
    assert w[1] > 0.8 and w[-1] < 1e-6  # agreeing minima: mostly held; a clear rejection: free
    assert frontier.held_weight(float("inf")) == 0.0 and frontier.held_weight(float("-inf")) == 1.0


@pytest.mark.parametrize("e3, leans", [(1.8, "held"), (1.2, "free")])
def test_prediction_lies_between_the_two_laws_and_leans_on_the_one_the_minima_prefer(e3, leans):
    """E held at the truth: the minima accept it, and the 30x forecast sits nearer the held law's; held far off:
    they reject it and the forecast is the free law's."""
    loss_B = minima()
    law, choice = frontier.choose(FLOPS_B, loss_B, e3, noise_sd=0.002)
    free = frontier.fit_largest(FLOPS_B, loss_B)
    held = frontier.fit_largest(FLOPS_B, loss_B, e_fixed=e3)
    c = 30 * FLOPS_B[-1]
    got, lf, lh = (float(frontier.loss_at(x, c)) for x in (law, free, held))
    assert min(lf, lh) - 1e-12 <= got <= max(lf, lh) + 1e-12
    w = law["weight_held"]
    assert w == pytest.approx(frontier.held_weight(choice["test"]["statistic"]))
    assert got == pytest.approx(w * lh + (1 - w) * lf, rel=1e-12)
    if leans == "held":
        assert choice["E_from"] == "approach 3" and abs(got - lh) < abs(got - lf)
    else:
        assert choice["E_from"].startswith("the minima") and got == pytest.approx(lf, rel=1e-6)
    assert float(frontier.asymptote(law)) == pytest.approx(w * e3 + (1 - w) * free["E"])


def test_a_law_without_the_mixture_is_evaluated_as_before():
    law = {"E": 1.7, "k": 300.0, "gamma": 0.12}
    assert frontier.loss_at(law, 1e20) == pytest.approx(1.7 + 300.0 * 1e20 ** -0.12)
    assert frontier.asymptote(law) == 1.7


def mixture(w, e_h=1.8, k_h=400.0, g_h=0.15, e_f=1.6, k_f=250.0, g_f=0.11) -> dict:
    return {"E": e_h, "k": k_h, "gamma": g_h, "weight_held": w, "E_held": e_h, "k_held": k_h, "gamma_held": g_h,
            "E_free": e_f, "k_free": k_f, "gamma_free": g_f}


def test_compute_multiplier_inverts_the_mixture():
    """The baseline's frontier reaches the variant's loss at m·C: `multiplier` recovers m, for a point law and for
    draws (K, 1) against compute values (Q,); a loss at or below the mixture's asymptote needs infinite compute."""
    flops_Q = np.array([1e19, 1e21, 1e23])
    base = mixture(0.3)
    for m in (0.5, 2.0, 7.0):
        loss_Q = frontier.loss_at(base, m * flops_Q)
        assert compare.multiplier(base, loss_Q, flops_Q) == pytest.approx(np.full(3, m), rel=1e-9)
    draws = {k: np.array([v, v])[:, None] for k, v in mixture(0.3).items()}
    draws["weight_held"] = np.array([[0.3], [0.9]])
    loss_KQ = frontier.loss_at(draws, 3.0 * flops_Q)
    assert loss_KQ.shape == (2, 3)
    assert compare.multiplier(draws, loss_KQ, flops_Q) == pytest.approx(np.full((2, 3), 3.0), rel=1e-9)
    floor = float(frontier.asymptote(base))
    assert np.isinf(compare.multiplier(base, np.array([floor, floor - 0.1]), np.array([1e20, 1e20]))).all()


def test_one_law_in_mixture_form_gives_the_closed_form_multiplier():
    single = {"E": 1.8, "k": 400.0, "gamma": 0.15}
    same = mixture(0.42, e_f=1.8, k_f=400.0, g_f=0.15)
    flops_Q, loss_Q = np.array([1e19, 1e22]), np.array([2.6, 2.1])
    assert compare.multiplier(same, loss_Q, flops_Q) == pytest.approx(compare.multiplier(single, loss_Q, flops_Q),
                                                                      rel=1e-9)


def test_stored_draws_carry_the_mixture_through_json():
    """fit.json's draws (null for a failed draw) come back as arrays with the mixture's keys, and evaluate to the
    same losses as the laws they were stored from."""
    laws = [mixture(0.2), mixture(0.8, e_f=1.5), None]
    stored = interval.draw_lists({k: np.array([np.nan if l is None else l[k] for l in laws])
                                  for k in ("E", "k", "gamma") + frontier.MIXTURE_KEYS})
    assert stored["weight_held"][2] is None
    arrays = frontier.draw_arrays(stored)
    assert set(arrays) == {"E", "k", "gamma", *frontier.MIXTURE_KEYS}
    got = frontier.loss_at(arrays, 1e22)
    assert got[:2] == pytest.approx([float(frontier.loss_at(l, 1e22)) for l in laws[:2]])
    assert np.isnan(got[2])
