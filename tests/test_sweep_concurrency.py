"""Sweeps under concurrency and faults: exclusive run claims, stale-claim takeover, two runners sharing
one sweep directory, retries of a failing run, a results writer killed mid-line."""
from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys
import time

from configs.sweeps import quick
from transformer.sweeps import runner
from transformer.design import plan
from transformer.sweeps import claims, results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": REPO}

_CLAIMER = """
import sys, time
from transformer.sweeps import claims
held = [i for i in range(40) if claims.try_claim(sys.argv[1], f"run{i}") is not None]
print(" ".join(map(str, held)), flush=True)
time.sleep(1.0)  # hold every claim until all claimers are done
"""


def test_claims_are_exclusive_across_processes(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _CLAIMER, str(tmp_path)], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    held = [set(map(int, p.communicate(timeout=60)[0].split())) for p in procs]
    assert set().union(*held) == set(range(40))
    assert sum(map(len, held)) == 40  # no run claimed twice


_JSON_WRITER = """
import sys
from transformer import files
for i in range(300):
    files.write_json(sys.argv[1], {"writer": sys.argv[2], "i": i, "pad": "x" * 4096})
"""


def test_two_processes_writing_one_json_file_neither_fails_nor_tears_it(tmp_path):
    # two sweep runners starting on one DIR both write DIR/sweep.json: with one shared temporary name,
    # one os.replace found the other's temporary file gone (FileNotFoundError; seen in CI)
    path = str(tmp_path / "sweep.json")
    procs = [subprocess.Popen([sys.executable, "-c", _JSON_WRITER, path, str(k)], cwd=REPO, env=ENV,
                              stderr=subprocess.PIPE, text=True) for k in range(2)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert json.load(open(path))["i"] == 299 and os.listdir(tmp_path) == ["sweep.json"]


def test_stale_claim_is_taken_over_and_a_live_one_is_not(tmp_path):
    first = claims.try_claim(str(tmp_path), "r", stale_after_s=60, heartbeat_s=0.05)
    assert first is not None and claims.try_claim(str(tmp_path), "r", stale_after_s=60) is None
    info = claims.owner(str(tmp_path), "r")
    assert info["pid"] == os.getpid() and info["age_s"] < 60
    first._stop.set()  # its owner dies: no more heartbeats
    time.sleep(0.1)
    old = time.time() - 120
    os.utime(first.path, (old, old))
    second = claims.try_claim(str(tmp_path), "r", stale_after_s=60)
    assert second is not None
    second.release()
    assert claims.owner(str(tmp_path), "r") is None

    # A runner killed on this host: its pid is gone, so its fresh claim is taken at once.
    dead = subprocess.run([sys.executable, "-c", "import sys; from transformer.sweeps import claims; "
                           "claims.try_claim(sys.argv[1], 'k'); import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                           str(tmp_path)], cwd=REPO, env=ENV)
    assert dead.returncode == -9 and claims.owner(str(tmp_path), "k")["age_s"] < 60
    assert claims.try_claim(str(tmp_path), "k", stale_after_s=600) is not None


def _doc(tmp_path, n: int = 2, **sweep):
    c = quick.get_config()
    c.sweep.update(sweep)
    runs, notes = plan.design(c).runs, plan.design(c).notes
    doc = runner.sweep_document(c, plan.Plan(runs[:n], notes))
    runner.write_sweep(str(tmp_path), doc)
    return doc


def test_failing_run_is_retried_then_recorded(tmp_path, monkeypatch):
    from transformer.training import loop

    calls = []

    def flaky(config, workdir, verbose=False, **options):
        calls.append(workdir)
        if len(calls) <= 2:  # the first run fails twice (e.g. a lost node), then works
            raise RuntimeError("transient fault")
        if "always_fail" in str(config["model"].get("activation", "")):  # a plain dict (sweep.json)
            raise RuntimeError("deterministic fault")
        return {"status": "ok", "wall_seconds": 1.0, "eval_loss": 3.0, "train_loss": 3.1}

    monkeypatch.setattr(loop, "train", flaky)
    doc = _doc(tmp_path, max_retries=2)
    doc["runs"][1]["config"]["model"]["activation"] = "always_fail"
    assert runner.run_in_process(str(tmp_path), doc) == 0
    rows = {r["run_id"]: r for r in results.read_results(str(tmp_path))}
    first, second = (rows[r["run_id"]] for r in doc["runs"])
    assert first["status"] == "ok" and first["eval_loss"] == 3.0
    assert second["status"] == "failed" and "deterministic fault (after 3 attempts)" in second["error"]
    assert len(calls) == 3 + 3
    assert not os.listdir(tmp_path / "claims")  # every claim released


def test_results_writer_killed_mid_line_loses_and_duplicates_nothing(tmp_path):
    """A process killed (SIGKILL) after writing half of its row: the next append cuts the torn line, so
    the killed run is recorded whole exactly once when it is recorded again, and earlier rows stay."""
    results.append_result(str(tmp_path), {"run_id": "a", "eval_loss": 3.0})
    killer = ("import os, signal, sys\n"
              "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\n"
              "os.write(fd, b'{\"eval_loss\": 2.5, \"run_id\": \"b\", \"stat')\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    p = subprocess.run([sys.executable, "-c", killer, str(tmp_path / results.RESULTS)], timeout=60)
    assert p.returncode == -9
    assert [r["run_id"] for r in results.read_results(str(tmp_path))] == ["a"]  # the torn row does not count
    assert results.append_result(str(tmp_path), {"run_id": "b", "eval_loss": 2.5, "status": "ok"})
    assert not results.append_result(str(tmp_path), {"run_id": "b", "eval_loss": 2.5, "status": "ok"})
    lines = open(tmp_path / results.RESULTS).read().splitlines()
    assert [json.loads(x)["run_id"] for x in lines] == ["a", "b"]  # every line whole


TINY = ["--config.sweep.budgets=1e9,3e9", "--config.sweep.sizes_per_budget=3", "--config.sweep.min_steps=5",
        "--config.sweep.size_span=8.0", "--config.sweep.prior_tokens_per_param=2.0",
        "--config.sweep.evals_per_run=2", "--config.sweep.checkpoints_per_run=2",
        "--config.base.data.seq_len=32", "--config.base.train.batch_size=8", "--config.base.train.eval_steps=1"]


@pytest.mark.slow
def test_two_runners_on_one_sweep_dir_share_the_runs(tmp_path, corpus_dir):
    workdir = str(tmp_path / "sweep")
    cmd = [sys.executable, "-m", "experiments.sweep", "--config=configs/sweeps/quick.py", f"--workdir={workdir}",
           *TINY, f"--config.base.data.data_dir={corpus_dir}"]
    procs = [subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    started = [{line.split("start ")[1].split(":")[0] for line in out.splitlines() if "] start " in line}
               for out in outs]
    design = json.load(open(os.path.join(workdir, "sweep.json")))
    ids = {r["run_id"] for r in design["runs"]}
    assert started[0] | started[1] == ids and not started[0] & started[1], started  # each run trained once
    assert all(started), started  # both runners did some of the work
    rows = results.read_results(workdir)
    assert sorted(r["run_id"] for r in rows) == sorted(ids) and all(r["status"] == "ok" for r in rows)
    assert os.path.exists(os.path.join(workdir, "fit", "fit.json"))
    assert not os.listdir(os.path.join(workdir, "claims"))
