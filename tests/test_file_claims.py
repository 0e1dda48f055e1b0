"""transformer/file_claims.py, the one claim mechanism (run claims, cache builds, the results.jsonl writers):
exclusive, taken over when stale or when its owner is a dead process of this host, kept fresh by its heartbeat,
never removed by a former owner; build_once builds once among threads and processes; hold serialises writers
where fcntl locks fail (NFS: ENOLCK)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from transformer import file_claims

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": REPO}


def _write_claim(path: str, host: str, pid: int, age_s: float = 0.0) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"host": host, "pid": pid, "time": time.time()}, f)
    t = time.time() - age_s
    os.utime(path, (t, t))


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_claim_is_exclusive_and_records_its_owner(tmp_path):
    path = str(tmp_path / "sub" / "x.claim")
    first = file_claims.try_claim(path, 60, 30, extra={"job": "12_3"})
    assert first is not None and file_claims.try_claim(path, 60, 30) is None
    info = file_claims.read(path)
    assert (info["host"], info["pid"], info["job"]) == (socket.gethostname(), os.getpid(), "12_3")
    assert info["age_s"] < 5 and file_claims.is_live(path, 60)
    first.release()
    assert file_claims.read(path) is None and not os.listdir(tmp_path / "sub")
    with pytest.raises(ValueError, match="must be positive"):
        file_claims.try_claim(path, 0, 30)


def test_a_stale_claim_is_taken_over_and_a_fresh_one_of_another_host_is_not(tmp_path):
    path = str(tmp_path / "x.claim")
    _write_claim(path, "node-elsewhere", 1, age_s=10)
    assert file_claims.try_claim(path, 60, 30) is None  # refreshed 10 s ago: alive, whatever its pid means here
    _write_claim(path, "node-elsewhere", 1, age_s=120)
    taken = file_claims.try_claim(path, 60, 30)
    assert taken is not None and taken.took_over["host"] == "node-elsewhere"
    assert file_claims.read(path)["pid"] == os.getpid()
    assert [n for n in os.listdir(tmp_path) if n != "x.claim"] == []  # the set-aside stale claim is gone
    taken.release()


def test_a_claim_of_a_dead_process_of_this_host_is_taken_over_at_once(tmp_path):
    path = str(tmp_path / "x.claim")
    _write_claim(path, socket.gethostname(), _dead_pid())  # fresh: only its pid tells it is dead
    assert not file_claims.is_live(path, 600)
    taken = file_claims.try_claim(path, 600, 30)
    assert taken is not None
    taken.release()
    # a process killed while holding a real claim (SIGKILL: nothing released)
    killed = subprocess.run([sys.executable, "-c", "import os, signal, sys; from transformer import file_claims; "
                             "file_claims.try_claim(sys.argv[1], 600, 30); os.kill(os.getpid(), signal.SIGKILL)", path],
                            cwd=REPO, env=ENV, timeout=60)
    assert killed.returncode == -9 and file_claims.read(path)["age_s"] < 60
    assert file_claims.try_claim(path, 600, 30) is not None


def test_a_dead_rule_decides_before_the_pid(tmp_path):
    path = str(tmp_path / "x.claim")
    _write_claim(path, "node-elsewhere", 1)
    assert file_claims.try_claim(path, 600, 30, dead=lambda info: None) is None  # cannot say: fresh, so alive
    assert file_claims.try_claim(path, 600, 30, dead=lambda info: info["host"] == "node-elsewhere") is not None


def test_the_heartbeat_keeps_a_claim_fresh_and_stops_with_its_owner(tmp_path):
    path = str(tmp_path / "x.claim")
    held = file_claims.try_claim(path, stale_after_s=0.5, heartbeat_s=0.05)
    old = time.time() - 100
    os.utime(path, (old, old))
    time.sleep(0.3)
    assert file_claims.read(path)["age_s"] < 0.3  # refreshed
    time.sleep(0.6)  # longer than stale_after_s: still held, because it beats
    assert file_claims.try_claim(path, stale_after_s=0.5, heartbeat_s=0.05, dead=lambda info: None) is None
    held._stop.set()  # its owner stalls (or dies on another host): no more beats
    time.sleep(0.7)
    assert file_claims.read(path)["age_s"] > 0.5


def test_a_former_owner_neither_refreshes_nor_removes_its_successors_claim(tmp_path):
    path = str(tmp_path / "x.claim")
    first = file_claims.try_claim(path, stale_after_s=1.0, heartbeat_s=0.05)
    first._stop.set()
    time.sleep(0.1)
    old = time.time() - 10
    os.utime(path, (old, old))
    # after that stall, another process took the stale claim over
    _write_claim(path + ".new", "node-elsewhere", 1)
    os.rename(path + ".new", path)
    first.release()
    assert file_claims.read(path)["host"] == "node-elsewhere"


def test_build_once_builds_once_among_threads(tmp_path):
    target, claim, built = str(tmp_path / "out"), str(tmp_path / "out.building"), []

    def build() -> str:
        built.append(threading.get_ident())
        time.sleep(0.5)
        with open(target + ".tmp", "w") as f:
            f.write("done")
        os.replace(target + ".tmp", target)
        return "built"

    got: list = []
    threads = [threading.Thread(target=lambda: got.append(file_claims.build_once(
        lambda: os.path.exists(target), claim, build, poll_s=0.02))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(built) == 1 and sorted(got, key=str) == [None, None, None, "built"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


_BUILDER = """
import os, sys, time
from transformer import file_claims
target, log = sys.argv[1], sys.argv[2]
def build():
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(0.5)
    with open(target + f".tmp{os.getpid()}", "w") as f:
        f.write("done")
    os.replace(target + f".tmp{os.getpid()}", target)
file_claims.build_once(lambda: os.path.exists(target), target + ".building", build, poll_s=0.02)
assert open(target).read() == "done"
"""


def test_build_once_builds_once_among_processes(tmp_path):
    target, log = str(tmp_path / "out"), str(tmp_path / "log")
    procs = [subprocess.Popen([sys.executable, "-c", _BUILDER, target, log], cwd=REPO, env=ENV) for _ in range(4)]
    assert [p.wait(60) for p in procs] == [0, 0, 0, 0]
    assert len(open(log).read().split()) == 1
    assert sorted(os.listdir(tmp_path)) == ["log", "out"]


def test_build_once_waits_with_progress_then_takes_a_dead_claim_over(tmp_path, capsys):
    target, claim = str(tmp_path / "out"), str(tmp_path / "out.building")
    _write_claim(claim, "node-elsewhere", 1)  # a builder on another host, refreshed now

    def make_stale() -> None:
        time.sleep(0.5)
        old = time.time() - 100
        os.utime(claim, (old, old))  # that host died

    threading.Thread(target=make_stale).start()
    got = file_claims.build_once(lambda: os.path.exists(target), claim, lambda: open(target, "w").close() or 7,
                                 stale_after_s=50, poll_s=0.02, waiting="waiting for the other builder",
                                 report_every_s=0.2)
    out = capsys.readouterr().out
    assert got == 7 and os.path.exists(target) and not os.path.exists(claim)
    assert out.startswith("waiting for the other builder\n")
    assert "still waiting after" in out and "held by node-elsewhere pid 1" in out
    assert "took over the dead claim" in out


def test_a_failing_build_leaves_no_claim_and_the_next_caller_builds(tmp_path):
    target, claim = str(tmp_path / "out"), str(tmp_path / "out.building")

    def fail() -> None:
        raise RuntimeError("bad data")

    with pytest.raises(RuntimeError, match="bad data"):
        file_claims.build_once(lambda: os.path.exists(target), claim, fail)
    assert os.listdir(tmp_path) == []
    assert file_claims.build_once(lambda: os.path.exists(target), claim, lambda: "ok") == "ok"


def test_hold_is_a_mutex_and_non_blocking_says_busy(tmp_path):
    path = str(tmp_path / "m.claim")
    with file_claims.hold(path) as got:
        assert got
        with file_claims.hold(path, blocking=False) as again:
            assert again is False
    assert not os.path.exists(path)


_APPENDER = """
import errno, fcntl, sys
def no_lock(*_):
    raise OSError(errno.ENOLCK, "No locks available")  # an NFS mount without lock support
fcntl.flock = fcntl.lockf = no_lock
from transformer.sweeps import results
for i in range(25):
    assert results.append_result(sys.argv[1], {"run_id": f"{sys.argv[2]}-{i}", "pad": "x" * 2000})
"""


def test_results_appends_from_several_processes_need_no_file_lock(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", _APPENDER, str(tmp_path), str(k)], cwd=REPO, env=ENV,
                              stderr=subprocess.PIPE, text=True) for k in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errors[0][-2000:]
    from transformer.sweeps import results

    lines = open(tmp_path / results.RESULTS).read().splitlines()
    assert len(lines) == 100 and len({json.loads(x)["run_id"] for x in lines}) == 100  # every line whole, once
    assert sorted(os.listdir(tmp_path)) == [results.RESULTS]  # the writers' claim is released


_COUNTER = """
import sys
from transformer import file_claims
path = sys.argv[1]
for _ in range(30):
    with file_claims.hold(path + ".claim"):
        n = int(open(path).read() or 0)
        with open(path, "w") as f:  # read-modify-write: two at once would lose an increment
            f.write(str(n + 1))
"""


def test_hold_excludes_other_processes(tmp_path):
    path = tmp_path / "count"
    path.write_text("0")
    procs = [subprocess.Popen([sys.executable, "-c", _COUNTER, str(path)], cwd=REPO, env=ENV) for _ in range(3)]
    assert [p.wait(120) for p in procs] == [0, 0, 0]
    assert path.read_text() == "90" and sorted(os.listdir(tmp_path)) == ["count"]


def _three_way_race(monkeypatch, path: str) -> tuple[object, object, object]:
    """The takeover race of three contenders, forced step by step: a dead claim (another host's, stale) at `path`;
    A reads it as dead; before A moves it aside, B takes it over (its fresh claim is now at `path`); A moves B's
    claim aside, reads it, sees a live claim; before A links it back, C claims the empty path. Returns (A's result,
    B's claim, C's claim)."""
    _write_claim(path, "node-elsewhere", 1, age_s=120)
    real_read, calls, got = file_claims.read, [], {}

    def read(p: str):
        info = real_read(p)
        if threading.current_thread() is threading.main_thread() and len(calls) < 2 and "A" not in got:
            calls.append(p)
            if len(calls) == 1:  # A has read the dead claim: B takes it over now
                got["B"] = _in_thread(lambda: file_claims.try_claim(path, 60, 30))
            else:  # A has moved B's claim aside and read it: C claims the empty path now
                assert ".stale-" in p and info["token"] == got["B"].token
                got["C"] = _in_thread(lambda: file_claims.try_claim(path, 60, 30))
        return info

    monkeypatch.setattr(file_claims, "read", read)
    got["A"] = file_claims.try_claim(path, 60, 30)
    monkeypatch.setattr(file_claims, "read", real_read)
    return got["A"], got["B"], got["C"]


def _in_thread(fn):
    """fn() run in its own thread (another contender), its result."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    return out[0]


def test_a_takeover_race_of_three_never_deletes_a_live_claim(tmp_path, monkeypatch):
    """issue 29, 3.1: A's link back fails (C holds the path); A must not delete B's live claim, and B, displaced,
    finds out (held(), its heartbeat) while C alone holds the path; B's release removes its displaced copy only."""
    path = str(tmp_path / "x.claim")
    a, b, c = _three_way_race(monkeypatch, path)
    assert a is None and b is not None and c is not None
    tokens = {name: file_claims.read(str(tmp_path / name))["token"] for name in os.listdir(tmp_path)}
    assert tokens == {"x.claim": c.token, f"x.claim.displaced-{b.token}": b.token}  # B's claim kept, not deleted
    assert not b.mine() and c.held() and not b.held()  # one owner: the file at the path
    b.release()
    assert c.held() and sorted(os.listdir(tmp_path)) == ["x.claim"]
    c.release()
    assert os.listdir(tmp_path) == []


def test_a_displaced_claims_heartbeat_notices_and_stops_refreshing(tmp_path, monkeypatch):
    path = str(tmp_path / "x.claim")
    _write_claim(path, "node-elsewhere", 1, age_s=120)
    held = file_claims.try_claim(path, stale_after_s=60, heartbeat_s=0.05)
    os.replace(path, f"{path}.displaced-{held.token}")  # what a racing taker does to it
    _write_claim(path, "node-elsewhere", 2, age_s=30)  # and a third process's claim, now at the path
    assert held.lost.wait(5)
    time.sleep(0.2)
    assert file_claims.read(path)["age_s"] > 20  # the other's claim is never refreshed by the displaced owner
    held.release()
    assert sorted(os.listdir(tmp_path)) == ["x.claim"] and file_claims.read(path)["pid"] == 2


def test_hold_rechecks_its_claim_before_and_after_the_section(tmp_path, monkeypatch):
    """A claim displaced as soon as it is made is waited for again, not entered; one lost during the section
    raises ClaimLost after it."""
    path = str(tmp_path / "m.claim")
    real_try = file_claims.try_claim
    other: list = []

    def displaced_at_once(*args, **kwargs):
        claim = real_try(*args, **kwargs)
        if claim is not None and not other:  # a racing taker moves it aside, a third process claims the path
            os.replace(path, f"{path}.displaced-{claim.token}")
            other.append(real_try(path, 60, 30))
            threading.Timer(0.3, other[0].release).start()
        return claim

    monkeypatch.setattr(file_claims, "try_claim", displaced_at_once)
    start = time.monotonic()
    with file_claims.hold(path) as got:
        assert got and time.monotonic() - start >= 0.25  # it waited for the third process
        assert file_claims.read(path)["token"] != other[0].token
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(file_claims, "try_claim", real_try)
    with pytest.raises(file_claims.ClaimLost, match="was not exclusive"):
        with file_claims.hold(path):
            token = file_claims.read(path)["token"]
            os.replace(path, f"{path}.displaced-{token}")
            _write_claim(path, "node-elsewhere", 3)
    assert file_claims.read(path)["pid"] == 3  # the other owner's claim is left alone


def test_a_claim_that_cannot_be_written_is_not_left_behind(tmp_path, monkeypatch):
    """A full disk while writing the claim: an empty claim file would block every other claimer until it went
    stale (120-600 s). The error names the claim's path and nothing is left; the next claimer gets it at once."""
    import errno

    path = str(tmp_path / "x.claim")
    real_write = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_claims.os, "write", full)
    with pytest.raises(OSError) as e:
        file_claims.try_claim(path, stale_after_s=600, heartbeat_s=60)
    assert e.value.errno == errno.ENOSPC and e.value.filename == path
    assert not os.path.exists(path)
    monkeypatch.setattr(file_claims.os, "write", real_write)
    claim = file_claims.try_claim(path, stale_after_s=600, heartbeat_s=60)
    assert claim is not None
    claim.release()
