"""What the SLURM scheduler says, through its client commands (squeue, sacct, scontrol, sinfo): the states of
jobs and array tasks, their exit codes, the partitions. Each function answers None (or leaves an entry out)
where the scheduler cannot say, never raises for a scheduler that is down or has no accounting: the callers
fall back on the task logs (slurm_jobs.py).

Job ids are strings: "12" (a job, or a whole array) or "12_3" (task 3 of array 12).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Iterable

# A task in these states still has a process that can run (or will run) its run: its claim is alive
ALIVE = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}


def available() -> bool:
    return shutil.which("squeue") is not None


def _run(cmd: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def own_task() -> str | None:
    """This process's SLURM job id as squeue names it ("12_3" for an array task, "15" for a job), or None."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def own_job_ids() -> set[str]:
    """Every id that names this process's job (its plain job id and, for an array task, ARRAY_TASK)."""
    return {i for i in (os.environ.get("SLURM_JOB_ID"), own_task()) if i}


def queue(job_ids: Iterable[str]) -> dict[str, tuple[str, str]] | None:
    """{task id: (state, reason)} of the queued (pending or running) tasks of the jobs `job_ids` (array ids or
    plain ids); a pending array's tasks not yet started are listed as "ARRAY_[1-3,5]". None: squeue failed."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    out = _run(["squeue", "-h", "-r", "-a", "-o", "%i|%F|%A|%T|%r"])  # all jobs: an id squeue forgot is no error
    if out is None or out.returncode:
        return None
    wanted = set(ids)
    found = {}
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5:
            continue
        task, array, job, state, reason = parts
        if {task, array, job} & wanted:
            found[task] = (state, reason)
    return found


def task_alive(task_id: str) -> bool | None:
    """Whether SLURM task `task_id` ("12_3" or "15") is running now; None where squeue cannot say."""
    q = queue([task_id.split("_")[0]])
    if q is None:
        return None
    state = q.get(task_id)
    return state is not None and state[0] in ALIVE


def ended_tasks(job_ids: Iterable[str]) -> dict[str, tuple[str, int | None]]:
    """{task id: (state, exit code)} of the finished tasks of `job_ids` as sacct records them, or where sacct has
    no accounting, as scontrol still remembers them (MinJobAge); tasks neither knows are left out."""
    ids = sorted(set(job_ids))
    found: dict[str, tuple[str, int | None]] = {}
    if not ids:
        return found
    out = _run(["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode", "-j", ",".join(ids)]) \
        if shutil.which("sacct") else None
    if out is not None and out.returncode == 0:
        for line in out.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and "[" not in parts[0]:
                found[parts[0]] = (parts[1].split()[0], _exit_code(parts[2]))
        if found:
            return found
    for job in ids:  # no accounting (sacct: "Slurm accounting storage is disabled"): scontrol's memory
        out = _run(["scontrol", "-o", "show", "job", job])
        if out is None or out.returncode:
            continue
        for line in out.stdout.splitlines():
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            task = f"{f['ArrayJobId']}_{f['ArrayTaskId']}" if f.get("ArrayTaskId", "").isdigit() else f.get("JobId")
            if task and f.get("JobState"):
                found[task] = (f["JobState"], _exit_code(f.get("ExitCode", "")))
    return found


def _exit_code(text: str) -> int | None:
    """SLURM's "code:signal" → the code (a signal s as 128 + s, as a shell reports it)."""
    try:
        code, sig = (int(x) for x in text.split(":"))
    except ValueError:
        return None
    return 128 + sig if sig else code


def requeue(task_id: str) -> bool:
    """scontrol requeue TASK: SLURM ends this attempt and queues the task again (same id, same log)."""
    out = _run(["scontrol", "requeue", task_id])
    return out is not None and out.returncode == 0


def partitions() -> list[dict[str, str]] | None:
    """One dict per node group of every partition (sinfo): partition (default marked by a trailing *), avail,
    timelimit, cpus, memory (MB), gres, features, nodes. None: sinfo failed."""
    out = _run(["sinfo", "-h", "-o", "%P|%a|%l|%c|%m|%G|%f|%D"])
    if out is None or out.returncode:
        return None
    keys = ("partition", "avail", "timelimit", "cpus", "memory", "gres", "features", "nodes")
    return [dict(zip(keys, line.strip().split("|"))) for line in out.stdout.splitlines() if line.count("|") == 7]
