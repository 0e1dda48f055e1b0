"""Run claims that know SLURM jobs (a real scheduler: .ci/slurm_localhost.sh): a claim records its task's job id;
a claim whose job has ended is dead at once (whatever its heartbeat), one whose job runs is held even from
another host, a task requeued (maybe onto another node) takes over its own claim, and workers of one attempt
(`--parallel` inside a job: the same job id) keep each other's claims."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from slurm_cluster import skip_without_cluster

from transformer.sweeps import claims, slurm_query

pytestmark = [pytest.mark.slurm, skip_without_cluster()]


def _claim_of(sweep_dir: str, run_id: str, job: str | None) -> None:
    """A fresh claim as a runner on another host wrote it (its pid means nothing here), in its task's first
    attempt (restart count 0)."""
    os.makedirs(os.path.join(sweep_dir, "claims"), exist_ok=True)
    with open(os.path.join(sweep_dir, "claims", f"{run_id}.claim"), "w") as f:
        json.dump({"host": "node-elsewhere", "pid": 1, "time": time.time(), "slurm_job": job, "slurm_restart": 0}, f)


def _wait_state(job: str, alive: bool, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and slurm_query.task_alive(job) is not alive:
        time.sleep(0.2)
    assert slurm_query.task_alive(job) is alive


def test_a_claim_lives_and_dies_with_its_slurm_job(tmp_path, monkeypatch):
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)
    job = subprocess.run(["sbatch", "--parsable", "--time=5", "--cpus-per-task=1", f"--output={tmp_path}/%j.out",
                          "--wrap=sleep 120"], capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        _wait_state(job, True)
        d = str(tmp_path / "sweep")
        _claim_of(d, "a", job)
        _claim_of(d, "b", None)  # no job id: only the heartbeat can tell (another host)
        assert claims.held(d, "a") and claims.held(d, "b")
        assert claims.try_claim(d, "a") is None
        # this process as another worker of the same attempt of that task: the claim stays held
        monkeypatch.setenv("SLURM_JOB_ID", job)
        assert claims.held(d, "a") and claims.try_claim(d, "a") is None
        # this process as the requeued attempt of that task: it takes over its own claim, which now names it
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        assert not claims.held(d, "a")
        mine = claims.try_claim(d, "a", heartbeat_s=60)
        assert mine is not None
        assert json.load(open(os.path.join(d, "claims", "a.claim")))["slurm_job"] == job
        assert json.load(open(os.path.join(d, "claims", "a.claim")))["slurm_restart"] == 1
        mine.release()
        monkeypatch.delenv("SLURM_JOB_ID")
        monkeypatch.delenv("SLURM_RESTART_COUNT")
        _claim_of(d, "a", job)
        subprocess.run(["scancel", job], check=True)
        _wait_state(job, False)
        assert not claims.held(d, "a") and claims.held(d, "b")  # its job ended: dead at once
        taken = claims.try_claim(d, "a", heartbeat_s=60)
        assert taken is not None
        taken.release()
    finally:
        subprocess.run(["scancel", job], capture_output=True)
