"""What a sweep says at its end and while it runs (issue 20 §4): whether the validation landed inside its interval,
which points the fit left out and why, an approach whose estimate is not credible, an ETA for the whole sweep."""
from __future__ import annotations

import json
import os

import pytest

from configs.sweeps import quick
from test_sweep_plan import _config, _simulate
from transformer.design import plan
from transformer.sweeps import outcome, results, runner
from transformer.sweeps.progress import Progress


def test_the_eta_covers_the_whole_sweep_not_the_current_stage():
    """The quick sweep's first stage is one budget (the next ones are designed from its results): its ETA is the
    whole preview plan's estimate, not the stage's."""
    c = quick.get_config()
    first = plan.design(c)  # no results yet: the first budget, waiting for it
    assert first.waiting and {r.stage for r in first.runs} == {"C1e11"}
    doc = runner.sweep_document(c, first)
    preview = plan.design(c, preview=True)
    whole = runner.sweep_document(c, preview)["estimated_seconds"]
    later = runner.later_seconds(preview, doc)
    assert later > 0 and doc["estimated_seconds"] + later == whole  # the same first stage, then the rest
    progress = Progress(doc["runs"], {}, later)
    assert progress.eta_seconds() == whole
    assert Progress(doc["runs"], {}).eta_seconds() == doc["estimated_seconds"]  # what the old ETA covered
    # resumed after its first run took 3× its estimate: the rest is expected at that speed too
    first_run = doc["runs"][0]
    resumed = Progress(doc["runs"], {first_run["run_id"]: {"status": "ok", "wall_seconds": 3 * first_run["estimated_seconds"]}},
                       later)
    assert resumed.eta_seconds() == pytest.approx(3 * (whole - first_run["estimated_seconds"]))


@pytest.mark.slow
def test_the_end_summary_names_excluded_points_and_says_whether_the_validation_landed_inside(tmp_path, capsys):
    c = _config(validate_flops=3.2e12)
    workdir = str(tmp_path)
    final, _ = _simulate(c, workdir)
    val = final.runs[-1]
    prediction = outcome.load_prediction(workdir)
    lo, hi = prediction["loss_ci95"]
    doc = runner.load_sweep(workdir)

    fit = outcome.finish(workdir, doc)
    measured = json.load(open(os.path.join(workdir, "fit", "validation.json")))["measured_loss"]
    inside = lo <= measured <= hi
    printed = capsys.readouterr().out
    assert ("inside its 95% interval" if inside else "OUTSIDE its 95% interval") in printed
    lines = outcome.summary_lines(fit)
    assert any(line.startswith(f"excluded {val.run_id}: role='validate'") and "the validation run" in line
               for line in lines)
    assert lines[-1].startswith("prediction check") and lines[-1].endswith(
        "inside its 95% interval" if inside else "OUTSIDE its 95% interval")

    # the validation run measured well above the interval: the console and the summary say so
    rows = results.read_results(workdir)
    for row in rows:
        if row["run_id"] == val.run_id:
            row["eval_loss"] = hi * 1.05
    with open(os.path.join(workdir, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.remove(os.path.join(workdir, "fit", "validation.json"))
    fit = outcome.finish(workdir, doc)
    assert "OUTSIDE its 95% interval" in capsys.readouterr().out
    assert outcome.summary_lines(fit)[-1].endswith("OUTSIDE its 95% interval")
    assert not outcome.finish(workdir, doc, announce=False)["validation"]["inside_ci95"]
    assert "prediction check" not in capsys.readouterr().out


def test_an_approach_whose_exponent_is_not_credible_says_so():
    """The quick sweep's own numbers (issue 20): approach 1's a = 0.058 beside approaches 2 and 3 near 0.5."""
    fit = {"approach1": {"a": 0.058, "a_ci95": [0.01, 0.10]}, "approach2": {"a": 0.529, "a_ci95": [0.45, 0.61]},
           "approach3": {"a": 0.48}, "points_excluded": []}
    warnings = outcome.credibility(fit)
    assert len(warnings) == 1 and warnings[0].startswith("approach1's a = 0.058 is not credible")
    assert "outside the 0.2–0.9" in warnings[0] and "from the approaches' median 0.480" in warnings[0]
    assert outcome.summary_lines(fit) == [f"warning: {warnings[0]}"]
    # a far estimate whose own interval covers the others' median is uncertain, not wrong
    fit["approach1"] = {"a": 0.30, "a_ci95": [0.1, 0.6]}
    assert outcome.credibility(fit) == []
    fit["approach1"] = {"a": 0.30, "a_ci95": [0.25, 0.35]}
    assert [w.split(" (")[0] for w in outcome.credibility(fit)] == ["approach1's a = 0.300 is not credible"]
