"""Run claims: which sweep runner trains which run, so that runners sharing a sweep directory never
train the same run twice.

A run's claim is DIR/claims/RUN_ID.claim, a claim file of transformer/file_claims.py (O_CREAT | O_EXCL, a
heartbeat refreshing its mtime, taken over when stale or when its owner was a pid of this host that no longer
exists). What is the sweep's own: the claim records, in a SLURM task, its job id ("12_3") and the task's
restart count (SLURM_RESTART_COUNT), and such a claim is also dead when that task is no longer running (squeue)
or is an earlier attempt of this process's own task (requeued, maybe onto another node: it takes over its own
claim). Workers of the same attempt (`--parallel=K` inside one job) share the job id and keep each other's
claims. A recorded run needs no claim: its runner removes it when it stops (Claim.release), and a claim a
runner left behind (killed after recording, or a worker whose row its parent wrote) is removed by
release_recorded, through the same takeover, so a live runner's claim is never touched.
"""
from __future__ import annotations

import os
from typing import Any, Collection

from transformer import file_claims
from transformer.file_claims import Claim
from transformer.sweeps import slurm_query

__all__ = ["CLAIMS", "Claim", "held", "owner", "release_recorded", "try_claim"]

CLAIMS = "claims"


def _path(sweep_dir: str, run_id: str) -> str:
    return os.path.join(sweep_dir, CLAIMS, f"{run_id}.claim")


def owner(sweep_dir: str, run_id: str) -> dict[str, Any] | None:
    """The claim's content plus its age in seconds (`age_s`), or None when unclaimed."""
    return file_claims.read(_path(sweep_dir, run_id))


def _restart_count() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def _slurm_task_dead(info: dict[str, Any]) -> bool | None:
    """The SLURM rule: a claim made in an earlier attempt of this process's own task (requeued: a lower restart
    count) or in a task that squeue no longer lists as running is dead; None (the generic rules decide) without
    a job id or squeue, or for a claim of this very attempt (another worker of the same job)."""
    job = info.get("slurm_job")
    if not job:
        return None
    if job in slurm_query.own_job_ids():
        return True if int(info.get("slurm_restart") or 0) < _restart_count() else None
    alive = slurm_query.task_alive(job) if slurm_query.available() else None
    return None if alive is None else not alive


def held(sweep_dir: str, run_id: str, stale_after_s: float = 600.0) -> bool:
    """Whether a live runner holds `run_id`: its claim exists, was refreshed within `stale_after_s`, and its
    owner is not known dead (a claim that is not held may be taken over)."""
    return file_claims.is_live(_path(sweep_dir, run_id), stale_after_s, _slurm_task_dead)


def try_claim(sweep_dir: str, run_id: str, *, stale_after_s: float = 600.0, heartbeat_s: float = 30.0) -> Claim | None:
    """Claims `run_id` for this process; None when another live runner holds it."""
    return file_claims.try_claim(_path(sweep_dir, run_id), stale_after_s, heartbeat_s,
                                 extra={"slurm_job": slurm_query.own_task(), "slurm_restart": _restart_count()},
                                 dead=_slurm_task_dead)


def release_recorded(sweep_dir: str, recorded: Collection[str], stale_after_s: float = 600.0) -> list[str]:
    """Removes the claim files left in DIR/claims/ for runs in `recorded` whose owner is gone (dead or stale:
    taken over, then released, as try_claim would); a live owner's claim stays until it releases it. Returns
    the run ids whose claim was removed. Best effort: a directory that cannot be written keeps its files."""
    folder = os.path.join(sweep_dir, CLAIMS)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in sorted(names):
        run_id = name[:-len(".claim")] if name.endswith(".claim") else None
        if run_id is None or run_id not in recorded:
            continue
        try:
            claim = try_claim(sweep_dir, run_id, stale_after_s=stale_after_s, heartbeat_s=stale_after_s)
        except OSError:
            continue
        if claim is not None:
            claim.release()
            out.append(run_id)
    return out
