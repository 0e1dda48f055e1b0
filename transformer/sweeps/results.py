"""A sweep's results file, DIR/results.jsonl: one JSON line per finished run, never two for one run.

Appends happen while holding the claim DIR/results.claim (file_claims.hold: an O_CREAT | O_EXCL claim file, no
fcntl lock, which NFS clients may not honour): mend the tail (repair_torn_tail), read the file, skip if the run
is already there, else append the line, every byte of it (a short write is continued; a write that fails, e.g. a
full disk, cuts the partial line off again and raises RecordError naming the file), and fsync. Several processes
(local workers, runners on several hosts, SLURM array tasks on a shared file system) may append at once: the
claim, not O_APPEND, keeps their lines apart (an O_APPEND write is atomic on a local file system, not over NFS,
where the client computes the offset). A writer killed while holding it leaves a claim taken over at once on its
own host (its pid is gone), else after LOCK_STALE_S.

A complete JSON line is never deleted: only a last line that does not parse (a writer killed mid-line) is cut,
and a line that does not parse elsewhere is skipped by readers. A run whose line is lost that way is recorded
again from its run directory (execute.recover).
"""
from __future__ import annotations

import json
import os
from contextlib import AbstractContextManager, suppress
from typing import Any, Callable

from transformer import file_claims

RESULTS = "results.jsonl"
LOCK = "results.claim"
LOCK_STALE_S = 120.0  # a holder refreshes it every 10 s; one not refreshed for this long is dead


class RecordError(RuntimeError):
    """A results row could not be written (a full or read-only disk): nothing of it is left in the file."""


def locked(sweep_dir: str) -> AbstractContextManager[bool]:
    """Holds the claim that serialises the writers of DIR/results.jsonl (a context manager)."""
    return file_claims.hold(os.path.join(sweep_dir, LOCK), stale_after_s=LOCK_STALE_S)


def _parse(line: bytes | str) -> dict[str, Any] | None:
    """A line's row, or None when it is not a complete JSON object (torn or damaged)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) and "run_id" in row else None


def read_results(sweep_dir: str) -> list[dict[str, Any]]:
    """The rows of DIR/results.jsonl; a line that is not a complete row (torn, damaged) is skipped."""
    path = os.path.join(sweep_dir, RESULTS)
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        return [row for line in f if line.strip() and (row := _parse(line)) is not None]


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


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte of `data` is written (a write may be short); an error raises OSError."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # no progress and no error: do not spin
            raise OSError(28, "no byte written (disk full?)")
        view = view[n:]


def _record_error(what: str, path: str, e: OSError) -> RecordError:
    return RecordError(f"could not {what} {path}: {e.strerror or e}; rerun the command once it can be written (a "
                       "finished run is recorded from its run directory)")


def append_result(sweep_dir: str, row: dict[str, Any]) -> bool:
    """Appends `row` unless a row with its run_id is already there; True when it was written. A write that fails
    leaves the file as it was and raises RecordError naming it."""
    path = os.path.join(sweep_dir, RESULTS)
    what = f"record run {row['run_id']} in"
    try:
        with locked(sweep_dir):
            if any(r.get("run_id") == row["run_id"] for r in read_results(sweep_dir)):
                return False
            repair_torn_tail(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                start = os.fstat(fd).st_size
                try:
                    _write_all(fd, (json.dumps(row, sort_keys=True) + "\n").encode())
                    os.fsync(fd)
                except OSError:
                    with suppress(OSError):  # no partial line is left to be read as a row, or mended into one
                        os.ftruncate(fd, start)
                        os.fsync(fd)
                    raise
            finally:
                os.close(fd)
            return True
    except OSError as e:  # a full or read-only disk (the results claim included)
        raise _record_error(what, path, e) from e


def remove_rows(sweep_dir: str, drop: Callable[[dict[str, Any]], bool]) -> list[str]:
    """Removes the rows for which `drop` is true (atomically, holding the results claim); returns their ids.
    Lines that are not rows stay as they are; nothing is written when no row is dropped."""
    path = os.path.join(sweep_dir, RESULTS)
    if not any(drop(r) for r in read_results(sweep_dir)):
        return []
    tmp = path + ".tmp"
    try:
        with locked(sweep_dir):
            with open(path, "rb") as f:
                lines = f.read().splitlines(keepends=True)
            dropped, kept = [], []
            for line in lines:
                row = _parse(line)
                if row is not None and drop(row):
                    dropped.append(row["run_id"])
                else:
                    kept.append(line if line.endswith(b"\n") else line + b"\n")
            try:
                with open(tmp, "wb") as f:
                    f.writelines(kept)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            finally:
                with suppress(OSError):
                    os.remove(tmp)
            return dropped
    except OSError as e:  # a full or read-only disk: the file stays as it was
        raise _record_error("rewrite", path, e) from e


def _last_line_start(f: Any, size: int, chunk: int = 1 << 16) -> int:
    """The offset where the file's last line begins (after its last newline; 0 without one)."""
    end = size
    while end > 0:
        begin = max(0, end - chunk)
        f.seek(begin)
        cut = f.read(end - begin).rfind(b"\n")
        if cut >= 0:
            return begin + cut + 1
        end = begin
    return 0


def repair_torn_tail(path: str) -> bool:
    """Mends the last line of the file, holding the claim: a last line without its newline that is complete
    JSON gets the newline (its run stays recorded); one that is not (a writer killed mid-write) is cut off, and
    its run, unrecorded, is recorded again whole. Returns True when something changed."""
    if not os.path.exists(path) or not os.path.getsize(path):
        return False
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return False
        start = _last_line_start(f, size)
        f.seek(start)
        try:
            json.loads(f.read())
            whole = True
        except ValueError:
            whole = False
        if whole:
            f.seek(size)
            f.write(b"\n")
        else:
            f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
    return True
