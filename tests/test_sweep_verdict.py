"""One run, once (issue 29, items 1.3, 1.8, 3.2): sweeps/execute.py makes a run's config (the sweep's data pin
included) for every executor, and its verdict is the one failure rule every reader of results rows uses: a run
that ends above the uniform guess or above the loss it started from is `diverged` (reported, never fitted, an
observation of its learning rate, not retried), like a non-finite one."""
from __future__ import annotations

import json
import os

import pytest

from configs.sweeps import lr_scan as lr_scan_config
from test_lr_scan_divergence import NONFINITE, _isoflop, _loss
from transformer.design import plan
from transformer.scaling.points import read_sweep
from transformer.sweeps import execute, results, run_groups, runner

VOCAB = 259  # the byte tokenizer's ids: ln 259 = 5.557 is a uniform guess's loss


def _row(run_id: str, eval_loss, status: str = "ok", **extra) -> dict:
    return {"run_id": run_id, "status": status, "eval_loss": eval_loss, "error": None, **extra}


def test_the_verdict_of_finished_diverged_and_failed_rows():
    assert execute.verdict(_row("a", 2.5, vocab_size_unpadded=VOCAB)) == ("ok", None)
    status, why = execute.verdict(_row("b", 18.56, vocab_size_unpadded=VOCAB))  # the run: 'ok' before
    assert status == "diverged" and "18.56 is above ln 259 = 5.557" in why
    status, why = execute.verdict(_row("b2", 5.43, vocab_size_unpadded=VOCAB, train_loss=6.47))  # the third run
    assert status == "diverged" and "final train loss 6.47 is above ln 259" in why
    status, why = execute.verdict(_row("c", 3.4, initial_loss=3.1))  # worse than where it started (a warm start)
    assert status == "diverged" and "above the train loss it logged first (3.1)" in why
    assert execute.verdict(_row("d", None))[0] == "diverged"  # train.nonfinite=skip: a null eval loss
    assert execute.verdict(_row("e", None, "failed", error=NONFINITE)) == ("diverged", NONFINITE)
    assert execute.verdict(_row("f", None, "failed", error="worker exited with code -9"))[0] == "failed"
    assert not execute.observed(_row("f", None, "failed", error="worker exited with code -9"))
    assert execute.observed(_row("b", 18.56, vocab_size_unpadded=VOCAB))


def test_a_run_recorded_from_its_summary_and_metrics_gets_the_verdict(tmp_path):
    c = _isoflop()
    workdir = str(tmp_path)
    _, doc = runner.plan_and_write(workdir, c)
    run = doc["runs"][0]
    run_dir = os.path.join(workdir, "runs", run["run_id"])
    os.makedirs(run_dir)
    every = run["config"]["train"]["log_every"]
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:  # its first logging interval: the start
        f.write(json.dumps({"step": every, "train_loss": 4.0}) + "\n")
    summary = {"status": "ok", "eval_loss": 4.5, "wall_seconds": 1.0, "vocab_size_unpadded": VOCAB}
    row, code = execute.record(workdir, run, summary, "isoflop")
    assert row["status"] == "diverged" and row["initial_loss"] == 4.0 and code == 1
    assert results.read_results(workdir)[0]["status"] == "diverged"  # as written: the fit reads the file


def test_a_diverged_run_is_reported_and_left_out_of_the_fit(tmp_path):
    """The issue's reproduction at row level (S with lr_exponent=8, lr_coefficient=1.7e-34, lr_max=100 gave rows
    with eval loss 99.3 and 18.6, status ok, fitted): recorded as the runner records them, they are diverged and
    the fit excludes them with the reason."""
    c = _isoflop()
    workdir = str(tmp_path)
    _, doc = runner.plan_and_write(workdir, c)
    blown = {doc["runs"][0]["run_id"]: 99.28, doc["runs"][5]["run_id"]: 18.56}
    for run in doc["runs"]:
        loss = blown.get(run["run_id"], _loss(run))
        execute.record(workdir, run, {"status": "ok", "eval_loss": loss, "wall_seconds": 1.0,
                                      "vocab_size_unpadded": VOCAB}, "isoflop")
    points = read_sweep(workdir)
    excluded = {p["id"]: p["reason"] for p in points.excluded}
    assert set(blown) <= set(excluded) and all("diverged" in excluded[k] for k in blown)
    assert not set(blown) & set(points.ids)


def test_rows_recorded_before_the_rule_are_judged_by_it_in_the_fit_and_compare(tmp_path):
    """Rows written before the verdict existed say status "ok" for a finite diverged loss: experiments.fit
    (points.read_sweep) and compare (its finished-sweep check) read them through the same rule as the sweep, so
    the fit leaves them out and compare counts them finished (--retry_failed would not train them again)."""
    from transformer.scaling import compare

    c = _isoflop()
    workdir = str(tmp_path)
    _, doc = runner.plan_and_write(workdir, c)
    blown = doc["runs"][2]["run_id"]
    for run in doc["runs"]:  # the old writer: status ok whatever the loss
        row = execute.result_row(run, {"eval_loss": 18.56 if run["run_id"] == blown else _loss(run),
                                       "vocab_size_unpadded": VOCAB}, "ok", None, 1.0, "isoflop")
        results.append_result(workdir, {**row, "vocab_size_unpadded": VOCAB})
    points = read_sweep(workdir)
    excluded = {p["id"]: p["reason"] for p in points.excluded}
    assert blown not in points.ids and "uniform guess" in excluded[blown], excluded
    grid = {"runs": [r["run_id"] for r in doc["runs"]], "name": "t"}
    assert compare.unfinished(workdir, grid, "--baseline") is None


def test_retry_failed_drops_failed_runs_and_keeps_diverged_ones(tmp_path):
    """--retry_failed (execute.drop_failed) and the other filters agree: a diverged calibration run (non-finite,
    or finite above the uniform guess) is an observation the design reads, so it is kept; before, it was
    retrained while the calibration counted it as an observation."""
    workdir = str(tmp_path)
    rows = [_row("nonfinite", None, "failed", error=NONFINITE, role="lr"),
            _row("blown", 18.56, vocab_size_unpadded=VOCAB, role="lr"),
            _row("killed", None, "failed", error="worker exited with code -9", role="lr"),
            _row("fine", 2.5, vocab_size_unpadded=VOCAB)]
    for r in rows:
        results.append_result(workdir, r)
    assert execute.drop_failed(workdir) == ["killed"]
    assert [r["run_id"] for r in results.read_results(workdir)] == ["nonfinite", "blown", "fine"]
    assert execute.drop_failed(workdir) == []


def test_the_calibration_counts_a_finite_diverged_rate_as_diverged(tmp_path):
    """The design reads rows through the same rule: a calibration run that ended above the uniform guess is a
    diverged rate (worse than every finite one, named in the notes), not a finite point at 18.6."""
    c = _isoflop(lr_calibration=dict(d_models=(16, 48)))
    workdir = str(tmp_path)
    blown = lambda run: run["role"] == "lr" and run["d_model"] == 48 and run["learning_rate"] > 0.0012
    for _ in range(10):  # runner.run_sweep's stage loop with the law in place of training
        p, doc = runner.plan_and_write(workdir, c)
        todo, _ = runner.pending_runs(workdir, doc["runs"])
        if not todo:
            break
        for run in todo:
            execute.record(workdir, run, {"status": "ok", "eval_loss": 18.56 if blown(run) else _loss(run),
                                          "wall_seconds": 1.0, "vocab_size_unpadded": VOCAB}, "isoflop")
    assert p.waiting is None
    assert any("d48-L2 (N=" in n and "diverged at learning rate 0.00149" in n for n in p.notes), p.notes
    d48 = next(s for s in p.lr_fit["sizes"] if s["shape"].startswith("d48"))
    assert d48["diverged"] == [0.001489]


def test_grouped_runs_carry_the_sweeps_data_pin(tmp_path, monkeypatch, capsys):
    """sweep.multirun's groups get their configs from execute.run_config, as single runs do: with the sweep's
    data.identity, so a group refuses data changed mid-stage (before: only execute.train_run set it)."""
    from transformer.training import loop

    c = lr_scan_config.get_config()
    c.sweep.multirun = True
    p = plan.design(c)
    doc = {**runner.sweep_document(c, plan.Plan(p.runs[:2], p.notes)), "data_identity": {"pin": "the sweep's data"}}
    workdir = str(tmp_path)
    runner.write_sweep(workdir, doc)
    seen = []

    def train_runs(configs, workdirs, verbose=False, **options):
        seen.extend(configs)
        return [{"status": "ok", "eval_loss": 18.56 if i else 3.0, "wall_seconds": 1.0, "vocab_size_unpadded": VOCAB}
                for i in range(len(configs))]

    monkeypatch.setattr(loop, "train_runs", train_runs)
    [group] = run_groups.groups(workdir, doc["runs"])
    assert len(group) == 2 and runner.run_in_process(workdir, doc) == 0
    assert [cfg["data"].get("identity") for cfg in seen] == [doc["data_identity"]] * 2
    assert runner.run_config(workdir, doc["runs"][0])["data"]["identity"] == doc["data_identity"]
    statuses = [r["status"] for r in results.read_results(workdir)]
    assert statuses == ["ok", "diverged"]
    out = capsys.readouterr().out
    assert "1 diverged" in out and f"DIVERGED {doc['runs'][1]['run_id']}: its eval loss 18.56" in out


@pytest.mark.parametrize("error, stops", [("worker exited with code -9", True), (NONFINITE, False)])
def test_the_slurm_step_stops_on_failed_runs_only(tmp_path, error, stops):
    """A grid run that diverged is an observation on SLURM too (before: only an "lr" role's was)."""
    from transformer.sweeps import slurm_jobs

    workdir = str(tmp_path)
    results.append_result(workdir, _row("x", None, "failed", error=error, role="grid"))
    assert [r["run_id"] for r in slurm_jobs._failed_rows(workdir)] == (["x"] if stops else [])


@pytest.mark.slow
def test_a_runner_holding_the_sweeps_claim_takes_over_a_run_directory_claim_left_on_another_host(tmp_path,
                                                                                                corpus_dir):
    """A SLURM task killed on one node and requeued on another leaves DIR/runs/RUN_ID/run.claim fresh for up to
    300 s (its host is not this one, so no pid says it is gone): train() alone refuses it, and the sweep recorded
    the run as failed. The runner that holds the sweep's claim on the run takes that claim over and trains it."""
    import json as json_
    import time

    c = _isoflop(budgets=(1e11,), sizes_per_budget=3)
    c.base.data.data_dir = corpus_dir
    workdir = str(tmp_path)
    _, doc = runner.plan_and_write(workdir, c)
    run = doc["runs"][0]
    run_dir = os.path.join(workdir, "runs", run["run_id"])
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "run.claim"), "w") as f:  # a task on another node, killed a moment ago
        json_.dump({"host": "node-elsewhere", "pid": 1, "time": time.time(), "token": "x"}, f)
    row, code = execute.train_run(workdir, run, doc["mode"])
    assert code == 0 and row["status"] == "ok", row
