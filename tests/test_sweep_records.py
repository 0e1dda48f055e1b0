"""DIR/results.jsonl never loses a finished run (issue 29, items 1.2, 1.5, 2.5, 2.6): a complete line is never
deleted, a run whose line is lost is recorded again from its run directory instead of changing the plan, every
byte of a row is written or none is (a full disk is an error naming the file), the claims of recorded runs are
removed, and a rerun with nothing to do writes nothing. Trained runs are replaced by rows of a known law (as in
tests/test_lr_scan_divergence.py)."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from test_lr_scan_divergence import _isoflop, _loss
from transformer.spec import ConfigError
from transformer.sweeps import claims, execute, outcome, results, runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lines(workdir: str) -> list[bytes]:
    with open(os.path.join(workdir, results.RESULTS), "rb") as f:
        return f.read().splitlines(keepends=True)


def test_a_whole_last_row_without_its_newline_is_kept_and_a_torn_one_cut(tmp_path):
    workdir = str(tmp_path)
    for run_id in ("a", "b"):
        results.append_result(workdir, {"run_id": run_id, "status": "ok"})
    path = os.path.join(workdir, results.RESULTS)
    with open(path, "rb+") as f:  # the newline of the last row lost (a copy, an editor, a crash after the bytes)
        f.truncate(os.path.getsize(path) - 1)
    assert results.append_result(workdir, {"run_id": "c", "status": "ok"})
    assert [json.loads(x)["run_id"] for x in _lines(workdir)] == ["a", "b", "c"]  # b kept, every line whole
    with open(path, "ab") as f:
        f.write(b'{"run_id": "d", "sta')  # a writer killed mid-line
    assert results.append_result(workdir, {"run_id": "e", "status": "ok"})
    assert [json.loads(x)["run_id"] for x in _lines(workdir)] == ["a", "b", "c", "e"]


def _finish_with_summaries(workdir: str, config) -> dict:
    """runner.run_sweep's stage loop with the law in place of training: each run's summary.json, then its row."""
    for _ in range(20):
        p, doc = runner.plan_and_write(workdir, config)
        if p.waiting == "prediction":
            outcome.predict(workdir, doc)
            continue
        todo, _ = runner.pending_runs(workdir, doc["runs"])
        if not todo:
            return doc
        for run in todo:
            summary = {"status": "ok", "eval_loss": _loss(run), "wall_seconds": 1.0}
            os.makedirs(os.path.join(workdir, "runs", run["run_id"]))
            with open(os.path.join(workdir, "runs", run["run_id"], "summary.json"), "w") as f:
                json.dump(summary, f)
            execute.record(workdir, run, summary, doc["mode"])
    raise AssertionError("the plan never completed")


def test_lost_rows_are_recorded_from_their_run_directories_and_the_plan_stays(tmp_path, capsys):
    """The issue's reproduction: the last row removed and the newline of the new last row; and a torn line in the
    middle (a calibration run the later stages were designed from). Before: the repair deleted the complete row and
    every rerun was 'holds a different sweep'."""
    c = _isoflop(lr_calibration=dict(d_models=(16, 48)))
    workdir = str(tmp_path)
    doc = _finish_with_summaries(workdir, c)
    before = {r["run_id"]: r for r in results.read_results(workdir)}
    assert len(before) == len(doc["runs"]) > 8
    lines = _lines(workdir)
    lines[1] = lines[1][:40] + b"\n"  # a torn line in the middle: a calibration run's
    lines = lines[:-1]
    lines[-1] = lines[-1].rstrip(b"\n")
    with open(os.path.join(workdir, results.RESULTS), "wb") as f:
        f.writelines(lines)
    p, again = runner.plan_and_write(workdir, c)  # before: ConfigError "holds a different sweep"
    assert p.waiting is None and [r["run_id"] for r in again["runs"]] == [r["run_id"] for r in doc["runs"]]
    after = {r["run_id"]: r for r in results.read_results(workdir)}
    assert after.keys() == before.keys()
    assert all(after[k]["eval_loss"] == before[k]["eval_loss"] and after[k]["status"] == "ok" for k in before)
    assert capsys.readouterr().out.count("from its run directory (its results row was missing)") == 2


def test_a_lost_row_without_a_run_directory_trains_again_instead_of_changing_the_sweep(tmp_path):
    c = _isoflop(lr_calibration=dict(d_models=(16, 48)))
    workdir = str(tmp_path)
    doc = _finish_with_summaries(workdir, c)
    first = doc["runs"][0]["run_id"]  # a calibration run: every later stage was designed from it
    os.remove(os.path.join(workdir, "runs", first, "summary.json"))
    results.remove_rows(workdir, lambda r: r["run_id"] == first)
    stat = os.stat(os.path.join(workdir, "sweep.json"))
    p, shrunk = runner.plan_and_write(workdir, c)  # before: ConfigError "holds a different sweep"
    assert p.waiting == "the learning-rate calibration"
    assert runner.pending_runs(workdir, shrunk["runs"])[0] == [shrunk["runs"][0]]
    assert os.stat(os.path.join(workdir, "sweep.json")).st_mtime_ns == stat.st_mtime_ns  # its runs kept


def test_a_rerun_with_nothing_to_do_writes_nothing(tmp_path):
    c = _isoflop()
    workdir = str(tmp_path)
    _finish_with_summaries(workdir, c)
    path = os.path.join(workdir, "sweep.json")
    before = os.stat(path)
    runner.plan_and_write(workdir, c)
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_rerun_under_another_schedule_writes_nothing(tmp_path):
    """The estimate note says how this invocation trains (--parallel, the GPUs it sees): a finished sweep rerun
    another way designs the same sweep, so DIR/sweep.json stays as it is (a read-only DIR reruns too)."""
    from transformer.design.estimate import Schedule
    from transformer.sweeps import next_stage

    c = _isoflop(max_hours=10.0)
    workdir = str(tmp_path)
    doc = _finish_with_summaries(workdir, c)
    assert any(n.startswith("estimated time") and "in one process" in n for n in doc["notes"])
    before = os.stat(os.path.join(workdir, "sweep.json"))
    ns = next_stage.next_stage(workdir, c, write=True, schedule=Schedule(how="in 2 worker processes, stage by stage"))
    assert any("in 2 worker processes" in n for n in ns.doc["notes"]) and not ns.todo  # said, not recorded
    after = os.stat(os.path.join(workdir, "sweep.json"))
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.fixture
def read_only(tmp_path):
    """(a writable directory, the same directory mounted read-only); skipped where mounting is not allowed."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        yield str(src), str(ro)
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_a_finished_sweep_reruns_in_a_read_only_directory_and_a_new_one_is_one_error(read_only):
    src, ro = read_only
    c = _isoflop()
    doc = _finish_with_summaries(src, c)
    outcome.finish(src, doc)
    code, again = runner.run_sweep(ro, c)  # before: OSError, rewriting sweep.json
    assert code == 0 and outcome.current_fit(ro, again) is not None  # the fit it holds, printed without refitting
    with pytest.raises(ConfigError, match=rf"--workdir={ro}/new: cannot write {ro}/new/sweep.json \(Read-only"):
        runner.plan_and_write(os.path.join(ro, "new"), c)


def test_a_short_write_is_continued_and_a_failed_one_leaves_nothing(tmp_path, monkeypatch):
    workdir = str(tmp_path)
    results.append_result(workdir, {"run_id": "a", "status": "ok"})
    real_write = os.write
    big = {"run_id": "b", "status": "ok", "pad": "x" * 5000}
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data)[:1000]) if len(data) > 2000
                        else real_write(fd, data))  # a file system that writes at most 1000 bytes at a time
    assert results.append_result(workdir, big)
    assert [json.loads(x) for x in _lines(workdir)][-1] == big  # before: 1000 bytes of it, a torn row

    def full(fd, data):  # a disk that fills after half the row
        if len(data) > 2000:
            real_write(fd, bytes(data)[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    kept = _lines(workdir)
    monkeypatch.setattr(os, "write", full)
    path = os.path.join(workdir, results.RESULTS)
    with pytest.raises(results.RecordError, match=rf"could not record run c in {path}: No space left on device; rerun"):
        results.append_result(workdir, {**big, "run_id": "c"})
    assert _lines(workdir) == kept  # no partial row that a reader would skip and a runner take for a claimed run


@pytest.mark.slow
def test_a_full_tmpfs_is_an_error_naming_results_jsonl_and_leaves_no_torn_row(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        workdir = str(disk)
        results.append_result(workdir, {"run_id": "a", "status": "ok"})
        fillers = []
        try:
            while True:  # fill the disk a page at a time
                fillers.append(os.path.join(workdir, f"fill{len(fillers)}"))
                with open(fillers[-1], "wb") as f:
                    f.write(b"x" * 4096)
        except OSError:
            os.remove(fillers.pop())
        for path in fillers[:2]:  # room for the results claim and one more page: the row's write is short
            os.remove(path)
        row = {"run_id": "b", "status": "ok", "pad": "x" * 10000}
        with pytest.raises(results.RecordError, match=r"results.jsonl: No space left on device"):
            results.append_result(workdir, row)
        assert [r["run_id"] for r in results.read_results(workdir)] == ["a"]
        assert _lines(workdir)[-1].endswith(b"\n") and len(_lines(workdir)) == 1
        for path in fillers[2:]:
            os.remove(path)
        assert results.append_result(workdir, row)  # space again: recorded whole
        assert [json.loads(x)["run_id"] for x in _lines(workdir)] == ["a", "b"]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def _dead_claim(workdir: str, run_id: str) -> None:
    """A claim on `run_id` by a process killed while holding it (a runner killed after recording the run)."""
    code = (f"import os, signal\nfrom transformer.sweeps import claims\n"
            f"claims.try_claim({workdir!r}, {run_id!r})\nos.kill(os.getpid(), signal.SIGKILL)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert p.returncode == -9 and claims.owner(workdir, run_id) is not None


def test_claims_of_recorded_runs_are_removed_and_live_ones_kept(tmp_path):
    c = _isoflop()
    workdir = str(tmp_path)
    doc = _finish_with_summaries(workdir, c)
    dead, live = doc["runs"][0]["run_id"], doc["runs"][1]["run_id"]
    _dead_claim(workdir, dead)
    held = claims.try_claim(workdir, live)  # a runner still finishing: its claim is its own to release
    try:
        runner.plan_and_write(workdir, c)
        assert sorted(os.listdir(os.path.join(workdir, claims.CLAIMS))) == [f"{live}.claim"]  # before: both
    finally:
        held.release()
    assert not os.listdir(os.path.join(workdir, claims.CLAIMS))


def test_a_dead_worker_whose_run_finished_is_recorded_from_its_run_directory(tmp_path):
    """The parallel runner's worker (or a SLURM task) killed between its summary.json and its row: the row comes
    from the run directory, not 'worker exited with code -9', and the claim it left is removed."""
    c = _isoflop()
    workdir = str(tmp_path)
    _, doc = runner.plan_and_write(workdir, c)
    done, lost = doc["runs"][:2]
    os.makedirs(os.path.join(workdir, "runs", done["run_id"]))
    with open(os.path.join(workdir, "runs", done["run_id"], "summary.json"), "w") as f:
        json.dump({"status": "ok", "eval_loss": 3.25, "wall_seconds": 1.0}, f)
    for run in (done, lost):
        _dead_claim(workdir, run["run_id"])
        runner.record_dead_worker(workdir, doc, run, "worker exited with code -9")
    rows = {r["run_id"]: r for r in results.read_results(workdir)}
    assert rows[done["run_id"]]["status"] == "ok" and rows[done["run_id"]]["eval_loss"] == 3.25
    assert rows[lost["run_id"]]["status"] == "failed" and "code -9" in rows[lost["run_id"]]["error"]
    assert not os.listdir(os.path.join(workdir, claims.CLAIMS))
