"""Claim files: which one of several processes (maybe on several hosts sharing a file system) does a piece of
work, without fcntl/flock locks (NFS clients may not honour them, or fail them with ENOLCK).

A claim is a file created with os.open(O_CREAT | O_EXCL) — atomic on local file systems and on NFSv3+ —
holding its owner's host, pid, start time, a unique token and the caller's extra fields (JSON). While it is
held, a heartbeat thread refreshes its mtime every `heartbeat_s` seconds. A claim is dead, and may be taken
over, when its mtime is older than `stale_after_s` (its owner was killed on another host, or that host died),
when it was made on this host by a pid that no longer exists, or when the caller's `dead` rule says so (the
sweep's: a SLURM task that is no longer running). The taker renames it to a unique name first (rename is
atomic: of several takers one succeeds), checks again that what it renamed was dead, then claims. What it
renamed may be a live claim (a racing taker's, made meanwhile): that claim is given back (linked back to the
path, which fails if a third process claimed the empty path meanwhile: then it is kept beside it as
PATH.displaced-TOKEN, never deleted). No process deletes a claim it did not write: a former owner's release and
heartbeat touch only a file that holds its own token, and a displaced owner finds out (`Claim.held`; its
heartbeat stops and warns; `hold` re-checks before and after the critical section).

- `try_claim`: one attempt; None while a live owner holds the claim.
- `build_once`: make an output once (the token cache, the built-in corpus, a SentencePiece model): the others
  wait for the output, or take over a dead claim.
- `hold`: a mutex for short critical sections (a sweep's results.jsonl appends, its fit, its submissions).

Ages are this host's clock against the file's mtime (the file server's clock on NFS): stale times are minutes,
far above the skew of synchronised clocks. Standard library only.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
ABSENT_RECHECKS = 5  # `Claim.held`: a claim absent this many reads (a racing taker moving it aside a moment) is lost
ABSENT_WAIT_S = 0.02
DeadRule = Callable[[dict[str, Any]], "bool | None"]  # True/False: the owner is dead/alive; None: cannot say


def read(path: str) -> dict[str, Any] | None:
    """The claim's content plus its age in seconds (`age_s`); None when there is no claim. A claim being written
    this instant (or not JSON) reads as {"age_s": ...}: its owner unknown, its age decides."""
    try:
        age = time.time() - os.path.getmtime(path)
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        info = None
    info = info if isinstance(info, dict) else {}
    info["age_s"] = age
    return info


def _pid_gone(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, TypeError, OverflowError):
        return False
    return False


def owner_is_dead(info: dict[str, Any], dead: DeadRule | None = None) -> bool:
    """Whether the owner recorded in `info` (a claim's content) is known to be gone: `dead`'s verdict where it
    gives one, else a pid of this host that no longer exists. This process's own claim is never dead."""
    here = socket.gethostname()
    if info.get("host") == here and info.get("pid") == os.getpid():
        return False
    if dead is not None:
        verdict = dead(info)
        if verdict is not None:
            return verdict
    return info.get("host") == here and "pid" in info and _pid_gone(info["pid"])


def is_live(path: str, stale_after_s: float, dead: DeadRule | None = None) -> bool:
    """Whether a live owner holds the claim at `path`: it exists, was refreshed within `stale_after_s` and its
    owner is not known dead (a claim that is not live may be taken over)."""
    info = read(path)
    return info is not None and info["age_s"] < stale_after_s and not owner_is_dead(info, dead)


class ClaimLost(RuntimeError):
    """A `hold` whose claim was taken over while it was held: the section was not exclusive (a fault: the holder
    stalled beyond `stale_after_s`, or three processes raced for a dead claim)."""


def displaced(path: str, token: str) -> str:
    """Where a live claim moved aside by a racing taker is kept when it cannot be given back (module docstring)."""
    return f"{path}.displaced-{token}"


def _give_back(aside: str, path: str, info: dict[str, Any] | None) -> None:
    """Puts a live claim that was moved to `aside` (by a taker, or a release that found it was not its own) back
    at `path`; where another claim took `path` meanwhile, keeps it as `displaced(path, token)` for its owner to
    find. Never deletes it."""
    try:
        os.link(aside, path)
    except FileExistsError:
        token = str((info or {}).get("token") or uuid.uuid4().hex)
        os.replace(aside, displaced(path, token))
        return
    os.remove(aside)  # the second name of the claim now back at `path`


class Claim:
    """A held claim: a heartbeat thread refreshes its mtime; `release()` (or leaving the `with` block) removes
    it. `took_over`: the dead claim's content this one replaced, or None. `lost`: set by the heartbeat when the
    file at `path` is no longer this claim (taken over after a stall, or displaced by a takeover race)."""

    def __init__(self, path: str, token: str, heartbeat_s: float, took_over: dict[str, Any] | None = None):
        self.path = path
        self.token = token
        self.took_over = took_over
        self._stop = threading.Event()
        self.lost = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(heartbeat_s,), daemon=True)
        self._thread.start()

    def mine(self) -> bool:
        """Whether the file at `path` is still this claim (not taken over by another process after a stall)."""
        info = read(self.path)
        return info is not None and info.get("token") == self.token

    def held(self) -> bool:
        """Whether this process still holds the claim: the file at `path` holds its token. A file that is absent
        for a moment (a racing taker moves it aside and gives it back) is read again, ABSENT_RECHECKS times."""
        for attempt in range(ABSENT_RECHECKS):
            info = read(self.path)
            if info is not None:
                return info.get("token") == self.token
            if attempt + 1 < ABSENT_RECHECKS:
                time.sleep(ABSENT_WAIT_S)
        return False

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            if not self.held():  # taken over or displaced: never refresh another's claim
                if not self._stop.is_set():
                    self.lost.set()
                    print(f"warning: the claim {self.path} is no longer this process's (taken over after a stall "
                          "of its heartbeat, or displaced by a racing takeover)", file=sys.stderr, flush=True)
                return
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        """Stops the heartbeat and removes the claim file if it is still this claim (moved aside first and checked,
        so that a claim taken over meanwhile is given back, not deleted), and a displaced copy of it."""
        self._stop.set()
        if self.held():
            aside = f"{self.path}.release-{self.token[:12]}"
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                aside = ""
            if aside:
                info = read(aside)
                if info is not None and info.get("token") == self.token:
                    os.remove(aside)
                else:
                    _give_back(aside, self.path, info)
        with contextlib.suppress(FileNotFoundError):
            os.remove(displaced(self.path, self.token))

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def try_claim(path: str, stale_after_s: float, heartbeat_s: float, extra: dict[str, Any] | None = None,
              dead: DeadRule | None = None) -> Claim | None:
    """Claims `path` for this process (its folder is created); None while a live owner holds it. A dead claim
    (module docstring) is taken over. `extra`: more fields recorded in the claim (JSON values)."""
    if stale_after_s <= 0 or heartbeat_s <= 0:
        raise ValueError(f"stale_after_s ({stale_after_s}) and heartbeat_s ({heartbeat_s}) must be positive")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    token = uuid.uuid4().hex
    body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "time": time.time(), "token": token,
                       **(extra or {})}).encode()
    took_over = None
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            info = read(path)
            if info is None:
                continue  # released meanwhile: try again
            if info["age_s"] < stale_after_s and not owner_is_dead(info, dead):
                return None
            aside = f"{path}.stale-{uuid.uuid4().hex[:8]}"
            try:  # dead: take it over (only one of several takers wins the rename)
                os.rename(path, aside)
            except FileNotFoundError:
                continue
            taken = read(aside)
            if taken is not None and taken["age_s"] < stale_after_s and not owner_is_dead(taken, dead):
                _give_back(aside, path, taken)  # lost a race to a fresh claim: it is not ours to delete
                return None
            took_over = taken
            with contextlib.suppress(FileNotFoundError):
                os.remove(aside)
            continue
        try:
            written = 0
            while written < len(body):  # a short write (a full disk) is continued, or fails below
                written += os.write(fd, body[written:])
            os.fsync(fd)
        except OSError as e:  # an empty or partial claim would block every other claimer until it is stale
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)  # ours: made by the O_EXCL create above
            raise OSError(e.errno, f"could not write the claim: {e.strerror}", path) from None
        os.close(fd)
        return Claim(path, token, heartbeat_s, took_over)
    return None


def _describe(info: dict[str, Any] | None) -> str:
    if not info:
        return "released"
    who = f"{info['host']} pid {info['pid']}" if "host" in info and "pid" in info else "an unknown process"
    return f"held by {who}, refreshed {info['age_s']:.0f} s ago"


def build_once(target_exists: Callable[[], bool], claim_path: str, build: Callable[[], T], *,
               stale_after_s: float = 300.0, heartbeat_s: float = 30.0, poll_s: float = 2.0,
               waiting: str | None = None, report_every_s: float = 60.0) -> T | None:
    """Makes an output once among processes that may all want it: if `target_exists()` is false, claim
    `claim_path`, check again, `build()` (writing to a temporary name and renaming it into place atomically is
    the caller's), release. While another process holds the claim, wait — printing `waiting` once, then a line
    every `report_every_s` — until the output appears or the claim dies (module docstring), then take over.
    Returns build()'s value, or None when the output was there (or made by another process). A build that
    raises releases the claim (nothing is left behind) and the exception propagates; a waiting process then
    claims and tries itself."""
    if target_exists():
        return None
    start = last_report = time.monotonic()
    announced = False
    while (claim := try_claim(claim_path, stale_after_s, heartbeat_s)) is None:
        if target_exists():
            return None
        now = time.monotonic()
        if waiting and not announced:
            print(waiting, flush=True)
            announced = True
        elif waiting and now - last_report >= report_every_s:
            print(f"  still waiting after {now - start:.0f} s: the claim {claim_path} is "
                  f"{_describe(read(claim_path))} (taken over when not refreshed for {stale_after_s:.0f} s)",
                  flush=True)
            last_report = now
        time.sleep(poll_s)
    with claim:
        if waiting and claim.took_over is not None:
            print(f"took over the dead claim {claim_path} ({_describe(claim.took_over)})", flush=True)
        if target_exists():
            return None
        return build()


@contextlib.contextmanager
def hold(path: str, *, stale_after_s: float = 120.0, heartbeat_s: float = 10.0, poll_s: float = 0.02,
         blocking: bool = True) -> Iterator[bool]:
    """A mutex over processes and hosts: holds the claim `path` for the block (waiting for a live owner to
    release it; a dead one's is taken over). Yields True; with `blocking=False`, yields False at once when
    another process holds it. Ownership is checked again before the block (a claim displaced by a racing
    takeover at once is waited for again) and after it: a claim lost during the block raises `ClaimLost` (the
    section was not exclusive). Not re-entrant: a process that holds `path` waits for itself."""
    wait = poll_s
    while True:
        claim = try_claim(path, stale_after_s, heartbeat_s)
        if claim is not None:
            if claim.held():
                break
            claim.release()  # displaced as soon as made: another process holds `path` now
        if not blocking:
            yield False
            return
        time.sleep(wait)
        wait = min(wait * 2, 0.5)
    with claim:
        yield True
        if not claim.held():
            raise ClaimLost(f"the claim {path} was taken over while this process held it: the section it guards "
                            f"was not exclusive (a stall beyond stale_after_s={stale_after_s:g} s, or a takeover "
                            "race)")
