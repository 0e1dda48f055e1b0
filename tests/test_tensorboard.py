"""TensorBoard out of the box: a run's event files hold its scalars, equal to metrics.jsonl, and a resumed
run's re-logged steps replace the interrupted run's (purge_step) instead of doubling.

The event files are read with TensorBoard's own loader (the plugin event multiplexer that `tensorboard
--logdir DIR` serves from), so what is checked is what its scalars dashboard shows, without a server.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.util import tensor_util

from transformer.training.metrics import MetricsWriter, read_metrics


def _resumed_run(workdir: str) -> None:
    """Rows up to step 8, then a resume from a step-4 checkpoint that logs 6 and 8 again, and 10."""
    w = MetricsWriter(workdir)
    for step in (2, 4, 6, 8):
        w.write(step, {"train_loss": 10.0 - step})
    w.close()
    w = MetricsWriter(workdir, resume_step=4)
    for step in (6, 8, 10):
        w.write(step, {"train_loss": 20.0 - step})
    w.close()


def _tensorboard_scalars(logdir: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """run → tag → [(step, value)], as TensorBoard's scalars plugin reads them from the event files."""
    mux = plugin_event_multiplexer.EventMultiplexer(purge_orphaned_data=True)  # tensorboard's default
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for run, tags in mux.PluginRunToTagToContent("scalars").items():
        out[run] = {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in mux.Tensors(run, tag)]
                    for tag in tags}
    return out


def test_event_files_hold_the_scalars_of_metrics_jsonl(tiny_lm_run, tmp_path):
    """A trained run (run "train") and a resumed one (run "resumed"): each run's scalars are its
    metrics.jsonl rows, each step once, the resumed run's values where it retrained."""
    shutil.copytree(tiny_lm_run, tmp_path / "train", ignore=shutil.ignore_patterns("checkpoints"))
    _resumed_run(str(tmp_path / "resumed"))
    assert [r["step"] for r in read_metrics(str(tmp_path / "resumed"))] == [2, 4, 6, 8, 10]
    assert len([f for f in os.listdir(tmp_path / "resumed") if "tfevents" in f]) == 2  # one file per writer
    scalars = _tensorboard_scalars(str(tmp_path))
    assert set(scalars) == {"train", "resumed"}
    for run in ("train", "resumed"):
        rows = read_metrics(str(tmp_path / run))
        assert set(scalars[run]) == {k for row in rows for k in row} - {"step"}, run
        for tag, points in scalars[run].items():
            logged = [(r["step"], r[tag]) for r in rows if tag in r]
            assert [s for s, _ in points] == [s for s, _ in logged], (run, tag)
            np.testing.assert_allclose([v for _, v in points], [v for _, v in logged], rtol=1e-6,
                                       err_msg=f"{run}/{tag}")  # event files store float32
    assert scalars["resumed"]["train_loss"] == [(2, 8.0), (4, 6.0), (6, 14.0), (8, 12.0), (10, 10.0)]


def test_tensorboard_cli_serves_a_resumed_runs_scalars_once(tmp_path):
    """Smoke test of `tensorboard --logdir DIR` with its default (fast, Rust) loader: the console script
    pip installs serves the resumed run's steps once each (a few seconds here)."""
    _resumed_run(str(tmp_path / "resumed"))
    exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    assert os.path.exists(exe), "tensorboard is a dependency: `pip install -e .` installs its command"
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--logdir", str(tmp_path), "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://localhost:{port}/data/plugin/scalars/scalars?tag=train_loss&run=resumed"
    try:
        deadline, points = time.time() + 30, None
        while not points:
            assert proc.poll() is None and time.time() < deadline, "tensorboard served nothing within 30 s"
            time.sleep(0.3)
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    points = json.loads(r.read())
            except (OSError, ValueError):
                pass
        rows = read_metrics(str(tmp_path / "resumed"))
        assert [(p[1], p[2]) for p in points] == [(r["step"], r["train_loss"]) for r in rows]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _points_at_dev_full(path: str) -> None:
    """Makes this process's open descriptor of `path` write to /dev/full: every write to it fails with ENOSPC,
    as on a disk that has just filled (the other files of the run still write)."""
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")
               if os.path.realpath(os.path.join("/proc/self/fd", fd)) == os.path.realpath(path)]
        assert fds, f"no open descriptor of {path}"
        for fd in fds:
            os.dup2(full, fd)
    finally:
        os.close(full)


def test_a_failed_write_of_the_events_file_is_raised_naming_it_not_a_hang(tmp_path):
    """tensorboardX writes the events file from a thread; when a write there failed (a disk that fills), the thread
    ended, its queue filled and the next row blocked forever: a run hung instead of stopping. The training's thread
    now gets the OSError, naming the events file (the command line then prints it as one error line)."""
    w = MetricsWriter(str(tmp_path))
    w.write(1, {"train_loss": 1.0})
    events, = [os.path.join(tmp_path, f) for f in os.listdir(tmp_path) if "tfevents" in f]
    _points_at_dev_full(events)
    outcome: dict = {}

    def rows() -> None:  # enough events to overflow the file's 8 KB buffer in the writer's thread, many times
        try:
            for step in range(2, 2000):
                w.write(step, {f"metric_{i}": float(step) for i in range(10)})
            w.close()
        except OSError as e:
            outcome["error"] = e

    t = threading.Thread(target=rows, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the writer blocked after the events file's write failed"
    e = outcome.get("error")
    assert e is not None and e.errno == errno.ENOSPC and e.filename == events, e
    assert read_metrics(str(tmp_path))[0]["step"] == 1  # metrics.jsonl, a file of its own, kept its rows
