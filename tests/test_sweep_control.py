"""Sweep reuse and control (issue 34 §4): the dry run says exactly what the real run does (one planning path,
sweeps/next_stage.py), a recorded sweep's design cannot be rewritten by a rerun with other sweep.* settings, and
--stages=N stops after N stages. Training is replaced by rows of a known law (tests/test_sweep_plan.py), through
the real runner (runner.run_sweep) with its train_run stubbed."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from test_sweep_plan import _config, _loss
from transformer.spec import ConfigError
from transformer.sweeps import execute, next_stage, results, runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _staged(**sweep):
    """Three budgets re-centred on the minima found, then the prediction and its validation run: every kind of
    stage (designed from results, the prediction)."""
    settings = dict(budgets=(1e11, 2e11, 4e11), sizes_per_budget=4, recenter=True, validate_flops=1.6e12,
                    fit_bootstrap=4)  # 4 noise draws: the prediction's fit in seconds
    return _config(**{**settings, **sweep})


@pytest.fixture
def trained(monkeypatch) -> list[str]:
    """The run ids runner.run_sweep trains, in order; each 'trains' to the law's loss: its summary.json, then its
    row, as execute.train_run records it."""
    out: list[str] = []
    rng = np.random.default_rng(0)

    def train_run(workdir, run, mode, verbose=False, max_retries=0):
        out.append(run["run_id"])
        summary = {"status": "ok", "eval_loss": _loss(run, rng), "wall_seconds": 1.0}
        os.makedirs(os.path.join(workdir, "runs", run["run_id"]), exist_ok=True)
        with open(os.path.join(workdir, "runs", run["run_id"], "summary.json"), "w") as f:
            json.dump(summary, f)
        return execute.record(workdir, run, summary, mode)

    monkeypatch.setattr(runner, "train_run", train_run)
    return out


def _tree(root: str) -> dict[str, int]:
    return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns for d, _, fs in os.walk(root) for f in fs}


def test_the_dry_run_says_what_the_real_run_then_trains_stage_by_stage(tmp_path, trained):
    """A fresh DIR, each half-finished state (a budget designed from the recorded ones; a lost row; the grid
    recorded and the prediction not made; the prediction written and its validation run not trained), and the
    finished DIR: the dry run's todo is what run_sweep trains next, and the dry run writes nothing. Before: the
    dry run printed the priors' plan whatever DIR held (13 runs on a finished sweep that trains none)."""
    c, workdir = _staged(), str(tmp_path / "s")
    states = []
    for step in range(10):
        before = _tree(str(tmp_path))
        dry = next_stage.next_stage(workdir, c, write=False)
        assert _tree(str(tmp_path)) == before  # nothing written, not even DIR
        if step == 1:  # a lost row: recorded from its run directory first, not trained again
            lost = list(dry.rows)[-1]  # the last run recorded
            results.remove_rows(workdir, lambda r: r["run_id"] == lost)
            dry = next_stage.next_stage(workdir, c, write=False)
            assert dry.recovered == [lost] and lost not in [r["run_id"] for r in dry.todo]
        if dry.plan.waiting == "prediction":  # the grid is recorded: the real run's first step is the fit
            assert dry.todo == [] and dry.prediction is None
            written = next_stage.next_stage(workdir, c, write=True)  # that step alone (a run stopped right after it)
            assert written.prediction is not None and [r["role"] for r in written.todo] == ["validate"]
            dry = next_stage.next_stage(workdir, c, write=False)  # the validation run: exact, from the prediction
        states.append((dry.plan.waiting, [r["stage"] for r in dry.todo]))
        trained.clear()
        code, doc = runner.run_sweep(workdir, c, stages=1)
        assert trained == [r["run_id"] for r in dry.todo], step
        if code == 0:
            break
        assert code == runner.STOPPED
    assert [(w, sorted(set(t))) for w, t in states] == [
        ("budget 1e11", ["C1e11"]), ("budget 2e11", ["C2e11"]), ("budget 4e11", ["C4e11"]), (None, ["validate"])]
    rows = results.read_results(workdir)
    assert len(rows) == len(doc["runs"]) == 13 and len({r["run_id"] for r in rows}) == 13
    stamp = _tree(workdir)
    finished = next_stage.next_stage(workdir, c, write=False)
    assert finished.todo == [] and finished.plan.waiting is None
    assert [r["run_id"] for r in finished.doc["runs"]] == [r["run_id"] for r in doc["runs"]]
    trained.clear()
    assert runner.run_sweep(workdir, c, stages=1) == (0, finished.doc) and trained == []
    assert _tree(workdir) == stamp


def test_stages_stops_after_n_stages_and_writes_nothing_of_the_next(tmp_path, trained):
    c, workdir = _staged(), str(tmp_path)
    code, doc = runner.run_sweep(workdir, c, stages=2)
    assert code == runner.STOPPED and len(trained) == 8  # two budgets of 4 sizes
    with open(os.path.join(workdir, "sweep.json")) as f:
        assert {r["stage"] for r in json.load(f)["runs"]} == {"C1e11", "C2e11"}  # the third not written
    assert {r["stage"] for r in doc["runs"]} == {"C1e11", "C2e11", "C4e11"}  # but designed: what remains
    trained.clear()
    assert runner.run_sweep(workdir, c, stages=1)[0] == runner.STOPPED and len(trained) == 4
    assert json.load(open(os.path.join(workdir, "sweep.json")))["waiting"] == "budget 4e11"  # not predicted yet
    assert not os.path.exists(os.path.join(workdir, "fit"))
    trained.clear()
    assert runner.run_sweep(workdir, c)[0] == 0 and len(trained) == 1  # the prediction, then the validation run


def test_retry_failed_in_the_dry_run_is_what_the_real_run_retrains(tmp_path, trained):
    """--retry_failed: the failed runs' rows go; one whose run directory says it finished is recorded from it, the
    other trains again, in the dry run as in the real run."""
    c, workdir = _staged(recenter=False, validate_flops=0.0), str(tmp_path)
    assert runner.run_sweep(workdir, c)[0] == 0
    failed, finished = trained[3], trained[5]
    rows = results.read_results(workdir)
    results.remove_rows(workdir, lambda r: True)
    for r in rows:
        results.append_result(workdir, {**r, "status": "failed", "error": "OSError: boom"}
                              if r["run_id"] in (failed, finished) else r)
    os.remove(os.path.join(workdir, "runs", failed, "summary.json"))
    assert next_stage.next_stage(workdir, c, write=False).todo == []  # a failed run is recorded
    dry = next_stage.next_stage(workdir, c, write=False, retry_failed=True)
    assert sorted(dry.retried) == sorted([failed, finished]) and dry.recovered == [finished]
    assert [r["run_id"] for r in dry.todo] == [failed]
    trained.clear()
    assert runner.run_sweep(workdir, c, retry_failed=True)[0] == 0 and trained == [failed]
    assert {r["run_id"]: r["status"] for r in results.read_results(workdir)}[finished] == "ok"


def test_a_recorded_design_cannot_be_rewritten_by_other_sweep_settings(tmp_path, trained):
    """The issue: a finished sweep rerun with sweep.size_span=7 (its runs were designed with 6; the ladder gives
    the same shapes, so the same run ids) was accepted and sweep.json rewritten to say size_span=7. Refused, for a
    finished sweep and an unfinished one alike, naming the setting; the settings of RERUN_SETTINGS may change."""
    c, workdir = _staged(), str(tmp_path)
    assert runner.run_sweep(workdir, c, stages=1)[0] == runner.STOPPED  # unfinished
    path = os.path.join(workdir, "sweep.json")
    for write in (False, True):
        with pytest.raises(ConfigError, match=r"sweep\.size_span \(recorded 6\.0, now 7\.0\).*sweep\.json.*new --workdir"):
            next_stage.next_stage(workdir, _staged(size_span=7.0), write=write)
    assert runner.run_sweep(workdir, c)[0] == 0  # finished
    stamp = _tree(workdir)
    for change in (dict(size_span=7.0), dict(fit_bootstrap=10), dict(lr_calibration=dict(multipliers=(0.5, 1.0)))):
        with pytest.raises(ConfigError, match="designed with other settings") as e:
            runner.run_sweep(workdir, _staged(**change))
        key = next(iter(change))
        assert f"sweep.{key}" in str(e.value)
    assert _tree(workdir) == stamp  # nothing written
    # how it is run may change (and is recorded: its workers read it from sweep.json); nothing trains again
    trained.clear()
    assert runner.run_sweep(workdir, _staged(max_retries=3, claim_timeout_s=60.0,
                                             slurm=dict(partition="gpu")))[0] == 0 and trained == []
    with open(path) as f:
        recorded = json.load(f)["sweep"]
    assert (recorded["max_retries"], recorded["claim_timeout_s"], recorded["slurm"]["partition"]) == (3, 60.0, "gpu")
    # a sweep.json written before a setting existed: the absent key had its default
    doc = json.load(open(path))
    del doc["sweep"]["warmup_tokens_per_param"], doc["sweep"]["seeds"]
    with open(path, "w") as f:
        json.dump(doc, f)
    assert next_stage.next_stage(workdir, _staged(max_retries=3, claim_timeout_s=60.0, slurm=dict(partition="gpu")),
                                 write=False).todo == []


def _sweep(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "experiments.sweep", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # CI's time (the default run is at its 15 minutes); -m slow runs it
def test_the_cli_dry_run_refuses_as_the_real_run_and_says_a_finished_sweep_trains_nothing(tmp_path, trained):
    """Before: `--dry_run` on a DIR holding another sweep exited 0 ("13 runs would train"), and on a finished
    sweep printed the priors' plan ("3 runs would train") where the rerun trains none."""
    from configs.sweeps import quick
    c = quick.get_config()
    c.sweep.fit_bootstrap = 4  # the prediction's fit in seconds
    workdir = str(tmp_path / "quick")
    assert runner.run_sweep(workdir, c)[0] == 0  # finished (the law's losses)
    stamp = _tree(str(tmp_path))
    quick_args = ("--config=configs/sweeps/quick.py", "--config.sweep.fit_bootstrap=4", f"--workdir={workdir}")
    out = _sweep(*quick_args, "--dry_run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"0 runs would train: all {len(trained)} runs of {workdir} are recorded" in out.stdout
    assert " train " not in out.stdout and " later " not in out.stdout
    out = _sweep(*quick_args, "--dry_run", "--launcher=slurm")  # before: the priors' runs as a job script
    assert out.returncode == 0 and out.stdout.startswith("# nothing to submit: every run of"), out.stdout[-2000:]
    for args, message, modes in ((("--config.sweep.size_span=7.0",), "sweep.size_span (recorded 6.0, now 7.0)",
                                  ("--dry_run", "--nodry_run")),
                                 (("--config.sweep.budgets=1e11,2e11,4e11", "--config.sweep.d_models=8,16,24,32,40,48"),
                                  "sweep.d_models", ("--dry_run",)),
                                 (("--config.base.train.b2=0.95",), "holds a different sweep", ("--dry_run",))):
        for mode in modes:
            out = _sweep(*quick_args, mode, *args)
            assert out.returncode == 2, (args, mode, out.stdout[-2000:], out.stderr[-2000:])
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], out.stderr
    out = _sweep(*quick_args, "--stages=0")
    assert out.returncode == 2 and "--stages=0 must be a positive number of stages" in out.stderr, out.stderr
    assert _tree(str(tmp_path)) == stamp  # nothing written by any of them


@pytest.mark.slow
def test_the_cli_trains_what_its_dry_run_said_stage_by_stage_and_goes_on_with_the_command_it_prints(tmp_path,
                                                                                                   corpus_dir):
    """The real command: the dry run of a fresh DIR, then of a half-finished one, lists what `--stages=1` then trains
    (the tiny sweep of tests/test_sweep.py, 2 budgets × 3 sizes); the stop says what remains and the command that
    goes on, which is run as printed; the finished sweep's dry run says nothing would train."""
    import re
    import shlex

    from test_sweep import TINY, _run, _sweep_cmd
    workdir = str(tmp_path / "tiny")
    cmd = _sweep_cmd(workdir, *TINY, f"--config.base.data.data_dir={corpus_dir}")
    for stage in ("C1e9", "C3e9"):
        dry = _run(cmd + ["--dry_run"])
        assert dry.returncode == 0, dry.stderr[-2000:]
        said = re.search(rf"^3 runs would train now \(stage {stage}\): (.*)$", dry.stdout, re.M).group(1).split()
        before = {r["run_id"] for r in results.read_results(workdir)}
        real = _run(cmd + ["--stages=1"])
        assert real.returncode == 0, real.stderr[-3000:]
        assert [r["run_id"] for r in results.read_results(workdir) if r["run_id"] not in before] == said
        stop = re.search(r"^stopped after 1 stage \(--stages=1\); remaining: (.*); go on with: (.*) \(--stages=N",
                         real.stdout, re.M)
        assert stop, real.stdout[-2000:]
        assert stop.group(1).startswith("stage C3e9: 3 runs (" if stage == "C1e9" else "the prediction"), stop.group(1)
        cmd = [sys.executable, *shlex.split(stop.group(2))[1:]]  # the command it prints, from here on
        assert "--stages=1" not in cmd
    dry = _run(cmd + ["--dry_run"])  # the grid is recorded: the fit first (2 budgets cannot predict: no validation)
    assert "no run would train before the prediction" in dry.stdout and "the command first fits it" in dry.stdout
    real = _run(cmd)
    assert real.returncode == 0 and "0 runs to go" in real.stdout and "approach2" in real.stdout, real.stderr[-2000:]
    assert len(results.read_results(workdir)) == 6
    dry = _run(cmd + ["--dry_run"])
    assert f"0 runs would train: all 6 runs of {workdir} are recorded; the command would print the fit made" in dry.stdout


def test_a_refused_rerun_writes_nothing_not_even_the_rows_it_would_repair(tmp_path, trained):
    """--retry_failed and a lost row on a DIR the command then refuses (another design): before, the failed rows
    were dropped and the lost row recorded before the refusal."""
    c, workdir = _staged(recenter=False, validate_flops=0.0), str(tmp_path)
    assert runner.run_sweep(workdir, c)[0] == 0
    rows = results.read_results(workdir)
    results.remove_rows(workdir, lambda r: True)
    for r in rows[:-1]:  # the last row lost (its run directory says it finished), the first one failed
        results.append_result(workdir, {**r, "status": "failed", "error": "OSError: boom"} if r is rows[0] else r)
    stamp = _tree(workdir)
    with pytest.raises(ConfigError, match=r"sweep\.size_span"):
        runner.run_sweep(workdir, _staged(recenter=False, validate_flops=0.0, size_span=7.0), retry_failed=True)
    assert _tree(workdir) == stamp and trained[-1] not in {r["run_id"] for r in results.read_results(workdir)}
