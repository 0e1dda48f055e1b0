"""Run claims: which sweep runner trains which run, so that runners sharing a sweep directory never
train the same run twice.

A claim is DIR/claims/RUN_ID.claim, created with os.open(O_CREAT | O_EXCL) — atomic on local file
systems and on NFSv3+ (unlike flock, which NFS clients may not honour) — holding the owner's host, pid,
start time and, in a SLURM task, its job id ("12_3"). The owner refreshes its mtime every `heartbeat_s`
seconds; a claim is dead, and may be taken over, when its mtime is older than `stale_after_s` (its owner
was killed or its host died), when it was made on this host by a pid that no longer exists, or when it
names a SLURM task that is no longer running (squeue) or that is this process's own task (requeued, maybe
onto another node: it takes over its own claim). The taker renames it to a unique name first (rename is
atomic: of two takers only one succeeds), then claims.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from transformer.sweeps import slurm_query

CLAIMS = "claims"


def _path(sweep_dir: str, run_id: str) -> str:
    return os.path.join(sweep_dir, CLAIMS, f"{run_id}.claim")


def owner(sweep_dir: str, run_id: str) -> dict[str, Any] | None:
    """The claim's content plus its age in seconds, or None when unclaimed."""
    path = _path(sweep_dir, run_id)
    try:
        with open(path) as f:
            info = json.load(f)
        info["age_s"] = time.time() - os.path.getmtime(path)
        return info
    except (OSError, ValueError):
        return None


class Claim:
    """A held claim; `release()` (or leaving the `with` block) removes it."""

    def __init__(self, path: str, heartbeat_s: float):
        self.path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(heartbeat_s,), daemon=True)
        self._thread.start()

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                os.utime(self.path)
            except OSError:
                continue  # momentarily renamed by a racing taker that will give it back

    def release(self) -> None:
        self._stop.set()
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _owner_is_dead(path: str) -> bool:
    """True when the claim was made on this host by a process that no longer exists, or by a SLURM task that
    is no longer running or is this process's own task in an earlier attempt (no need to wait for its
    heartbeat to go stale)."""
    try:
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return False  # being written or replaced right now: not ours to judge
    mine = info.get("host") == socket.gethostname() and info.get("pid") == os.getpid()
    job = info.get("slurm_job")
    if job and not mine:
        if job in slurm_query.own_job_ids():  # this task, requeued: its earlier attempt is gone
            return True
        alive = slurm_query.task_alive(job) if slurm_query.available() else None
        if alive is not None:
            return not alive
    if info.get("host") != socket.gethostname() or mine:
        return False
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, ValueError, TypeError):
        return False
    return False


def held(sweep_dir: str, run_id: str, stale_after_s: float = 600.0) -> bool:
    """Whether a live runner holds `run_id`: its claim exists, was refreshed within `stale_after_s`, and was not
    made on this host by a process that no longer exists (a claim that is not held may be taken over)."""
    path = _path(sweep_dir, run_id)
    try:
        age = time.time() - os.path.getmtime(path)
    except FileNotFoundError:
        return False
    return age < stale_after_s and not _owner_is_dead(path)


def try_claim(sweep_dir: str, run_id: str, *, stale_after_s: float = 600.0, heartbeat_s: float = 30.0) -> Claim | None:
    """Claims `run_id` for this process; None when another live runner holds it."""
    path = _path(sweep_dir, run_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time(),
                       "slurm_job": slurm_query.own_task()}).encode()
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                age = time.time() - os.path.getmtime(path)
            except FileNotFoundError:
                continue  # released meanwhile: try again
            if age < stale_after_s and not _owner_is_dead(path):
                return None
            aside = f"{path}.stale-{uuid.uuid4().hex[:8]}"
            try:  # stale: take it over (only one of several takers wins the rename)
                os.rename(path, aside)
            except FileNotFoundError:
                continue
            if time.time() - os.path.getmtime(aside) < stale_after_s and not _owner_is_dead(aside):  # lost a race
                try:
                    os.link(aside, path)  # give it back (fails if someone claimed meanwhile)
                except FileExistsError:
                    pass
                os.remove(aside)
                return None
            continue
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        return Claim(path, heartbeat_s)
    return None
