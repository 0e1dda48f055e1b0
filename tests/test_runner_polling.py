"""The parallel runner's poll loop (runner.run_parallel) with stand-in worker processes (issue 19, hole 10): a
branch whose source was claimed by a runner that died does not wait forever (the source is taken over), and
results.jsonl is read once per change of the file, not once per pending run and slot at every poll."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from transformer.sweeps import claims, results, runner

MAX_POLLS = 2000  # a runner that spins (the regression) fails here instead of hanging the test


def _doc(branches: int) -> dict:
    """A sweep document of one source run "src" and `branches` runs that branch from it."""
    def run(i: int, rid: str, src: str | None) -> dict:
        return {"run_id": rid, "index": i, "branch_from": src, "params": 1000, "flops": 6e7, "steps": 10, "learning_rate": 1e-3,
                "estimated_seconds": 1.0, "start_step": 5 if src else 0}
    runs = [run(0, "src", None)] + [run(i + 1, f"b{i}", "src") for i in range(branches)]
    return {"mode": "isoflop", "runs": runs, "sweep": {"claim_timeout_s": 600.0}}


def _write_row(workdir: str, run_id: str) -> None:
    """A worker's results row, appended without results.read_results (so the test counts the runner's reads)."""
    with open(os.path.join(workdir, results.RESULTS), "a") as f:
        f.write(json.dumps({"run_id": run_id, "status": "ok", "eval_loss": 2.0, "wall_seconds": 1.0}) + "\n")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _stand_in(workdir: str, doc: dict, on_claimed, polls_to_finish: int = 2):
    """A Popen stand-in: the worker of run I claims it as the real worker does (runner.claim); held elsewhere it
    exits with CLAIMED_ELSEWHERE (and calls on_claimed), else it records its run after `polls_to_finish` polls."""
    launched: list[str] = []

    class Worker:
        def __init__(self, cmd, **kwargs):
            self.run = doc["runs"][int(cmd[-1].split("=")[1])]
            self.pid, self.returncode, self.polls = 0, None, 0
            launched.append(self.run["run_id"])
            self.held = runner.claim(workdir, doc, self.run)
            if self.held is None:
                on_claimed(self.run)

        def poll(self):
            if self.held is None:
                self.returncode = runner.CLAIMED_ELSEWHERE
                return self.returncode
            self.polls += 1
            if self.polls < polls_to_finish:
                return None
            _write_row(workdir, self.run["run_id"])
            self.held.release()
            self.returncode = 0
            return 0

    return Worker, launched


def _patch(monkeypatch, worker) -> dict:
    polls = {"n": 0}

    def sleep(_s: float) -> None:
        polls["n"] += 1
        if polls["n"] > MAX_POLLS:
            raise AssertionError(f"the runner still polls after {MAX_POLLS} rounds: it spins")

    monkeypatch.setattr(runner.subprocess, "Popen", worker)
    monkeypatch.setattr(runner, "worker_env", lambda slot, parallel: ({}, None))
    monkeypatch.setattr(runner.time, "sleep", sleep)
    return polls


def test_a_branch_source_claimed_by_a_runner_that_died_is_taken_over(tmp_path, monkeypatch):
    # another runner on this host claims "src" (alive when our worker tries it), then dies: the branches must not
    # wait for a run nobody will train
    workdir = str(tmp_path)
    doc = _doc(branches=3)
    path = os.path.join(workdir, claims.CLAIMS, "src.claim")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}, f)  # alive: ours

    dead = _dead_pid()  # (before Popen is replaced by the stand-in)

    def owner_dies(run: dict) -> None:
        with open(path, "w") as f:
            json.dump({"host": socket.gethostname(), "pid": dead, "time": time.time()}, f)

    worker, launched = _stand_in(workdir, doc, owner_dies)
    polls = _patch(monkeypatch, worker)
    assert runner.run_parallel(workdir, doc, parallel=2) == 0
    assert {r["run_id"] for r in results.read_results(workdir)} == {"src", "b0", "b1", "b2"}
    assert launched[:2] == ["src", "src"] and polls["n"] < MAX_POLLS


def test_a_live_claim_on_a_branch_source_is_waited_for(tmp_path, monkeypatch):
    # the other runner is alive and records "src" itself after a while: the branches start then, "src" is not
    # trained here
    workdir = str(tmp_path)
    doc = _doc(branches=2)
    assert claims.try_claim(workdir, "src") is not None  # held by this (live) process
    worker, launched = _stand_in(workdir, doc, lambda run: None)
    polls = _patch(monkeypatch, worker)
    original = runner.time.sleep

    def sleep(s: float) -> None:
        original(s)
        if polls["n"] == 20:  # the other runner finishes its run
            _write_row(workdir, "src")
            os.remove(os.path.join(workdir, claims.CLAIMS, "src.claim"))

    monkeypatch.setattr(runner.time, "sleep", sleep)
    assert runner.run_parallel(workdir, doc, parallel=2) == 0
    assert launched == ["src", "b0", "b1"]
    assert {r["run_id"] for r in results.read_results(workdir)} == {"src", "b0", "b1"}


@pytest.mark.parametrize("branches", [4, 40])
def test_results_are_read_once_per_change_not_per_pending_run(tmp_path, monkeypatch, branches):
    # "src" trains for 50 polls while its branches wait: the runner's reads of results.jsonl must not grow with
    # the number of waiting runs (before: one read per waiting branch per free slot per poll)
    workdir = str(tmp_path)
    doc = _doc(branches)
    worker, _ = _stand_in(workdir, doc, lambda run: None, polls_to_finish=50)
    polls = _patch(monkeypatch, worker)
    reads = {"n": 0}
    read = results.read_results

    def counting(sweep_dir: str) -> list:
        reads["n"] += 1
        return read(sweep_dir)

    monkeypatch.setattr(results, "read_results", counting)
    assert runner.run_parallel(workdir, doc, parallel=2) == 0
    recorded = len(read(workdir))
    assert recorded == branches + 1
    # one read per change of the file (each run's row, appended once) and the claims' checks, whatever the
    # number of polls (over 50 here) and of waiting runs
    assert reads["n"] <= 2 * (branches + 1) + 2 and polls["n"] > 50
