"""A sweep's results file, DIR/results.jsonl: one JSON line per finished run, never two for one run.

Appends happen while holding the claim DIR/results.claim (file_claims.hold: an O_CREAT | O_EXCL claim file, no
fcntl lock, which NFS clients may not honour): cut a torn last line (a writer killed mid-write), read the file,
skip if the run is already there, else append the line with a single write and fsync. Several processes (local
workers, runners on several hosts, SLURM array tasks on a shared file system) may append at once: the claim,
not O_APPEND, keeps their lines apart (an O_APPEND write is atomic on a local file system, not over NFS, where
the client computes the offset). A writer killed while holding it leaves a claim taken over at once on its own
host (its pid is gone), else after LOCK_STALE_S.
"""
from __future__ import annotations

import json
import os
from contextlib import AbstractContextManager
from typing import Any

from transformer import file_claims

RESULTS = "results.jsonl"
LOCK = "results.claim"
LOCK_STALE_S = 120.0  # a holder refreshes it every 10 s; one not refreshed for this long is dead


def locked(sweep_dir: str) -> AbstractContextManager[bool]:
    """Holds the claim that serialises the writers of DIR/results.jsonl (a context manager)."""
    return file_claims.hold(os.path.join(sweep_dir, LOCK), stale_after_s=LOCK_STALE_S)


def read_results(sweep_dir: str) -> list[dict[str, Any]]:
    """The rows of DIR/results.jsonl; a torn last line (a writer killed mid-write) is skipped."""
    path = os.path.join(sweep_dir, RESULTS)
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


class Cache:
    """DIR/results.jsonl's rows by run id, read again only when the file changed (inode, size, mtime): a poll
    loop reads it once per change, not once per pending run."""

    def __init__(self, sweep_dir: str):
        self.path = os.path.join(sweep_dir, RESULTS)
        self.sweep_dir = sweep_dir
        self._key: tuple | None = None
        self._rows: dict[str, dict[str, Any]] = {}

    def rows(self) -> dict[str, dict[str, Any]]:
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            key = None
        if key is None:
            self._key, self._rows = None, {}
        elif key != self._key:
            self._key, self._rows = key, {r["run_id"]: r for r in read_results(self.sweep_dir)}
        return self._rows


def append_result(sweep_dir: str, row: dict[str, Any]) -> bool:
    """Appends `row` unless a row with its run_id is already there; True when it was written."""
    path = os.path.join(sweep_dir, RESULTS)
    with locked(sweep_dir):
        if any(r.get("run_id") == row["run_id"] for r in read_results(sweep_dir)):
            return False
        repair_torn_tail(path)
        data = json.dumps(row, sort_keys=True) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True


def drop_failed(sweep_dir: str) -> list[str]:
    """Removes the failed rows (atomically, holding the results claim) so those runs run again; returns their ids."""
    path = os.path.join(sweep_dir, RESULTS)
    with locked(sweep_dir):
        rows = read_results(sweep_dir)
        failed = [r["run_id"] for r in rows if r.get("status") != "ok"]
        if failed:
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows if r.get("status") == "ok")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        return failed


def repair_torn_tail(path: str) -> bool:
    """Cuts a torn last line (a writer killed mid-write: no newline yet) off the file, holding the
    claim. That row was never complete, so its run counts as unrecorded and is recorded again whole.
    Returns True when something was cut."""
    if not os.path.exists(path) or not os.path.getsize(path):
        return False
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - (1 << 20)))
        tail = f.read()
        if tail.endswith(b"\n"):
            return False
        cut = tail.rfind(b"\n")
        f.truncate(size - len(tail) + cut + 1 if cut >= 0 else size - len(tail))
        f.flush()
        os.fsync(f.fileno())
    return True
