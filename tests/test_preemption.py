"""Preemption across processes: a SIGTERM that reaches one of two processes (jax.distributed on 127.0.0.1,
2 x 2 CPU devices) stops both at one step within seconds, with a checkpoint there, although train.log_every
is longer than the run (the processes agree on stopping at a wall-time interval, not at log steps).

Run as a script, this file is one of the two processes: `python tests/test_preemption.py WORKDIR DATA_DIR
PROCESS_ID PORT READY_FILE` (READY_FILE is written once the train step is compiled).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from xla_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 100_000  # far more than the test waits for: the run must stop early
SETTINGS = {"data.seq_len": 32, "train.steps": STEPS, "train.batch_size": 8, "train.warmup_steps": 1,
            "train.log_every": STEPS, "train.eval_every": STEPS, "train.eval_steps": 1,
            "train.checkpoint_every": STEPS}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two 2-process start-ups: minutes on 2 shared cores
def test_sigterm_to_one_process_stops_both_at_one_checkpointed_step(tmp_path, corpus_dir):
    workdir, port = str(tmp_path / "run"), _free_port()
    env = {**os.environ, "PYTHONPATH": REPO, "XLA_FLAGS": xla_flags(2)}
    ready = [str(tmp_path / f"ready_{i}") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), workdir, corpus_dir, str(i), str(port),
                               ready[i]], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(2)]
    try:
        deadline = time.time() + 600
        while not all(os.path.exists(r) for r in ready):
            assert time.time() < deadline and all(p.poll() is None for p in procs), "the processes did not start"
            time.sleep(0.5)
        time.sleep(3)  # some steps in
        procs[1].send_signal(signal.SIGTERM)  # not process 0: the one that writes the summary
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["status"] == "preempted" and 0 < summary["step"] < STEPS
    assert f"checkpointed step {summary['step']}" in outs[0]  # process 0 heard of it from process 1
    assert str(summary["step"]) in os.listdir(os.path.join(workdir, "checkpoints"))


def _process(workdir: str, data_dir: str, process_id: int, port: int, ready: str) -> None:
    """One of the two processes (the train CLI's set-up, then train), checking for a stop about every second."""
    from ml_collections import ConfigDict

    from configs import lm
    from experiments.jax_setup import setup_jax

    c = lm.get_config("gpt2_tiny")
    c.data.data_dir = data_dir
    for key, value in SETTINGS.items():
        section, name = key.split(".")
        c[section][name] = value
    c.distributed = ConfigDict({**c.distributed.to_dict(), "coordinator_address": f"127.0.0.1:{port}",
                                "num_processes": 2, "process_id": process_id})
    setup_jax(c)
    from transformer.training import loop
    try:
        from transformer.training import guards
        guards.PREEMPTION_CHECK_SECONDS = 1.0
    except ImportError:  # the code before guards.py, which checked at log steps only
        pass
    compile_step = loop.compile_step

    def compiled_then_ready(*args):
        fn = compile_step(*args)
        open(ready, "w").close()
        return fn

    loop.compile_step = compiled_then_ready
    assert loop.train(c, workdir)["status"] == "preempted"


if __name__ == "__main__":
    _process(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
