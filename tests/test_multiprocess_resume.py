"""Two processes on 127.0.0.1 (jax.distributed, 2 x 2 CPU devices) resume a run that is already at its last step
(summary.json deleted, so the run is not "finished"): every process must agree on whether the final evaluation
is still missing. Only process 0 reads metrics.jsonl; if the others decided alone, they would enter the
evaluation's collectives without it and wait forever."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from xla_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {"data.seq_len": 32, "train.steps": 2, "train.batch_size": 8, "train.warmup_steps": 1,
            "train.log_every": 2, "train.eval_every": 2, "train.eval_steps": 2, "train.checkpoint_every": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(workdir: str, data_dir: str) -> list[subprocess.Popen]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": REPO, "XLA_FLAGS": xla_flags(2)}
    return [subprocess.Popen(
        [sys.executable, "-m", "experiments.train", "--config=configs/lm.py:gpt2_tiny", f"--workdir={workdir}",
         f"--config.data.data_dir={data_dir}", *(f"--config.{k}={v}" for k, v in SETTINGS.items()),
         f"--config.distributed.coordinator_address=127.0.0.1:{port}", "--config.distributed.num_processes=2",
         f"--config.distributed.process_id={i}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]


def _wait(procs: list[subprocess.Popen], timeout: float) -> str:
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append(out)
            assert p.returncode == 0, out[-3000:]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise AssertionError(f"the processes did not finish in {timeout:.0f} s (a deadlock?): "
                             + "\n".join(p.communicate()[0][-1500:] for p in procs)) from None
    return "\n".join(outs)


def _summary(workdir: str) -> dict:
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)


@pytest.mark.slow  # two 2-process runs: minutes on 2 shared cores
def test_two_processes_resume_a_run_at_its_last_step(tmp_path, corpus_dir):
    workdir = str(tmp_path / "run")
    _wait(_two_processes(workdir, corpus_dir), timeout=600)
    finished = _summary(workdir)
    assert finished["status"] == "ok" and finished["step"] == SETTINGS["train.steps"]
    os.remove(os.path.join(workdir, "summary.json"))
    out = _wait(_two_processes(workdir, corpus_dir), timeout=300)
    assert f"resuming from step {SETTINGS['train.steps']}" in out, out[-3000:]
    resumed = _summary(workdir)
    assert resumed["status"] == "ok" and resumed["step"] == finished["step"]
    assert resumed["eval_loss"] == finished["eval_loss"] and resumed["eval_loss"] is not None
