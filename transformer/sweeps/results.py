"""A sweep's results file, DIR/results.jsonl: one JSON line per finished run, never two for one run.

Appends happen under an exclusive fcntl lock on DIR/results.lock: cut a torn last line (a writer killed
mid-write), read the file, skip if the run is already there, else append the line with a single write
and fsync. Several processes (local workers,
SLURM array tasks on a shared file system with working locks) may append at once.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Any, Iterator

RESULTS = "results.jsonl"
LOCK = "results.lock"


@contextlib.contextmanager
def locked(path: str, blocking: bool = True) -> Iterator[bool]:
    """Holds an exclusive flock on `path` (created if missing); yields False when non-blocking and busy."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


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
    with locked(os.path.join(sweep_dir, LOCK)):
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
    """Removes the failed rows (atomically, under the lock) so those runs run again; returns their ids."""
    path = os.path.join(sweep_dir, RESULTS)
    with locked(os.path.join(sweep_dir, LOCK)):
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
    """Cuts a torn last line (a writer killed mid-write: no newline yet) off the file, under the caller's
    lock. That row was never complete, so its run counts as unrecorded and is recorded again whole.
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
