"""TensorBoard out of the box: `tensorboard --logdir DIR` serves a run's scalars, equal to metrics.jsonl,
and a resumed run's re-logged steps replace the interrupted run's (purge_step) instead of doubling."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

from transformer.training.metrics import MetricsWriter, read_metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


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


def test_tensorboard_cli_serves_the_scalars_of_metrics_jsonl(tiny_lm_run, tmp_path):
    """`tensorboard --logdir` over a trained run (run "train") and a resumed one (run "resumed"): each
    run's scalars are its metrics.jsonl rows, each step once, the resumed run's values where it retrained."""
    shutil.copytree(tiny_lm_run, tmp_path / "train", ignore=shutil.ignore_patterns("checkpoints"))
    _resumed_run(str(tmp_path / "resumed"))
    assert [r["step"] for r in read_metrics(str(tmp_path / "resumed"))] == [2, 4, 6, 8, 10]
    exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")  # the console script pip installs
    assert os.path.exists(exe), "tensorboard is a dependency: `pip install -e .` installs its command"
    port = _free_port()
    proc = subprocess.Popen([exe, "--logdir", str(tmp_path), "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline, tags = time.time() + 120, {}
        while set(tags) != {"train", "resumed"}:  # the first answers may come before both runs are loaded
            assert proc.poll() is None, proc.stdout.read()
            assert time.time() < deadline, f"tensorboard did not list both runs within 120 s: {tags}"
            time.sleep(0.5)
            try:
                tags = _get(f"http://localhost:{port}/data/plugin/scalars/tags")
            except OSError:
                pass
        for run in ("train", "resumed"):
            rows = read_metrics(str(tmp_path / run))
            assert set(tags[run]) == {k for row in rows for k in row} - {"step"}
            points = _get(f"http://localhost:{port}/data/plugin/scalars/scalars?tag=train_loss&run={run}")
            assert [(p[1], p[2]) for p in points] == [(r["step"], r["train_loss"]) for r in rows], run
    finally:
        proc.terminate()
        proc.wait(timeout=30)
