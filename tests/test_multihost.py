"""Multi-host: 2 processes x 2 CPU devices on 127.0.0.1 (jax.distributed, the distributed.* keys) train like
1 process x 4 devices with the same command line (the global batch of a step does not depend on the process
count), and a run preempted on 2 processes resumes on 1 at its exact data position.

Run as a script, this file is a preempted 2-process run: `python tests/test_multihost.py WORKDIR DATA_DIR
PROCESS_ID PORT` trains the same config as the CLI runs below with `stop_at=STOP_AT` (the loop's preemption
path: it checkpoints the step it is on, writes summary.json with status "preempted" and stops).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
from xla_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {"data.seq_len": 32, "train.steps": 8, "train.batch_size": 8, "train.warmup_steps": 1,
            "train.log_every": 2, "train.eval_every": 4, "train.eval_steps": 2, "train.checkpoint_every": 4}
STOP_AT = 4
COMPARED = ("train_loss", "eval_loss", "eval_bits_per_byte", "grad_norm")


def _env(devices: int) -> dict:
    return {**os.environ, "PYTHONPATH": REPO, "XLA_FLAGS": xla_flags(devices)}


def _distributed(pid: int, count: int, port: int) -> list[str]:
    return [f"--config.distributed.coordinator_address=127.0.0.1:{port}",
            f"--config.distributed.num_processes={count}", f"--config.distributed.process_id={pid}"]


def _cli(workdir: str, data_dir: str, devices: int, process: tuple[int, int, int] | None = None) -> subprocess.Popen:
    """The train CLI on `devices` CPU devices; `process` = (id, count, port) for a jax.distributed run."""
    cmd = [sys.executable, "-m", "experiments.train", "--config=configs/lm.py:gpt2_tiny", f"--workdir={workdir}",
           f"--config.data.data_dir={data_dir}", *(f"--config.{k}={v}" for k, v in SETTINGS.items()),
           *(_distributed(*process) if process else [])]
    return subprocess.Popen(cmd, cwd=REPO, env=_env(devices), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(workdir: str, data_dir: str, stop: bool = False) -> list[subprocess.Popen]:
    port = _free_port()
    if not stop:
        return [_cli(workdir, data_dir, 2, (i, 2, port)) for i in range(2)]
    return [subprocess.Popen([sys.executable, os.path.abspath(__file__), workdir, data_dir, str(i), str(port)],
                             cwd=REPO, env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in range(2)]


def _wait(procs: list[subprocess.Popen]) -> str:
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        outs.append(out)
        assert p.returncode == 0, out[-3000:]
    return "\n".join(outs)


def _rows(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _summary(workdir: str) -> dict:
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_dir):
    """one: 1 process x 4 devices; stopped: 2 processes x 2 devices preempted after step STOP_AT, then resumed by
    the 1-process command line. (The uninterrupted 2-process run is `two_run`, built only for the slow test.)"""
    base = tmp_path_factory.mktemp("multihost")
    one, stopped = str(base / "one"), str(base / "stopped")
    uninterrupted = [_cli(one, corpus_dir, 4)]
    out = _wait(_two_processes(stopped, corpus_dir, stop=True))  # the first to end: it trains half as long
    assert f"stop_at={STOP_AT}: checkpointed step {STOP_AT}" in out, out[-3000:]
    preempted = _summary(stopped)
    shutil.copytree(stopped, str(base / "stopped_at_4"))  # as the 2 processes left it, for the restore test
    resumed = _wait([_cli(stopped, corpus_dir, 4)] + uninterrupted)
    assert f"resuming from step {STOP_AT}" in resumed, resumed[-3000:]
    return {"one": one, "stopped": stopped, "preempted": preempted, "at_stop": str(base / "stopped_at_4")}


@pytest.fixture(scope="module")
def two_run(tmp_path_factory, corpus_dir) -> str:
    """2 processes x 2 devices, uninterrupted, with the command line of `runs`' "one"."""
    two = str(tmp_path_factory.mktemp("multihost_two") / "two")
    _wait(_two_processes(two, corpus_dir))
    return two


def _assert_same_run(a: str, b: str, rtol: float) -> float:
    """Every logged value of COMPARED and the final summary's losses agree to `rtol`; returns the largest
    relative difference."""
    rows_a, rows_b = _rows(a), _rows(b)
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b] == [2, 4, 6, 8]  # process 0 alone wrote them
    pairs = [(x[k], y[k]) for x, y in zip(rows_a, rows_b) for k in COMPARED if k in x or k in y]
    pairs += [(_summary(a)[k], _summary(b)[k]) for k in ("eval_loss", "eval_bits_per_byte", "train_loss")]
    x, y = np.array(pairs, np.float64).T
    np.testing.assert_allclose(x, y, rtol=rtol, atol=0)
    assert len(pairs) == 4 * 2 + 2 * 2 + 3  # train_loss and grad_norm every row, evaluations at 4 and 8
    return float(np.max(np.abs(x - y) / np.abs(y)))


@pytest.mark.slow
def test_two_processes_train_like_one_with_the_same_command_line(runs, two_run):
    worst = _assert_same_run(two_run, runs["one"], rtol=1e-5)
    print(f"largest relative difference 2 processes x 2 devices vs 1 x 4: {worst:.3g}")
    rows = _rows(runs["one"])
    assert rows[0]["train_loss"] > rows[-1]["train_loss"] + 0.1  # it trained: the comparison is not trivial
    summary = _summary(two_run)
    assert summary["status"] == "ok" and summary["num_devices"] == 4


def test_preempted_on_two_processes_resumes_on_one_at_its_data_position(runs):
    preempted = runs["preempted"]
    assert preempted["status"] == "preempted" and preempted["step"] == STOP_AT
    data = os.path.join(runs["at_stop"], "checkpoints", str(STOP_AT), "data")
    states = {n: json.load(open(os.path.join(data, n))) for n in sorted(os.listdir(data)) if n.startswith("process_")}
    assert states == {f"process_{i}-of-2.json": {"next_batch": STOP_AT} for i in range(2)}  # small, the same
    worst = _assert_same_run(runs["stopped"], runs["one"], rtol=1e-5)
    print(f"largest relative difference preempted on 2 processes, resumed on 1 vs uninterrupted: {worst:.3g}")
    summary = _summary(runs["stopped"])
    assert summary["status"] == "ok" and summary["step"] == 8 and summary["epochs"] == _summary(runs["one"])["epochs"]


def _path_key(path: tuple) -> str:
    """A key path as orbax names it on disk: attribute, dict key or sequence index, joined by '/'."""
    return "/".join(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)


def _saved(step_dir: str) -> dict:
    """The state as saved: the checkpoint's arrays read by orbax as plain numpy (no shardings, no project code)."""
    import jax
    import orbax.checkpoint as ocp

    path = os.path.join(step_dir, "state")
    tree = ocp.PyTreeCheckpointer().metadata(path).item_metadata.tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    saved = ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(restore_args=args))
    return {_path_key(p): np.asarray(a) for p, a in jax.tree_util.tree_flatten_with_path(saved)[0]}


def _config(data_dir: str):
    from configs import lm

    c = lm.get_config("gpt2_tiny")
    c.data.data_dir = data_dir
    for key, value in SETTINGS.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def test_a_two_process_checkpoint_restores_here_bit_for_bit(runs, corpus_dir):
    """The step written by 2 processes x 2 devices, restored the way the loop resumes in this process (1 process,
    8 devices; checksum verified): every array equals what was saved, and the iterator is at the saved batch."""
    import jax

    from transformer.models import build_model
    from transformer.tasks import get_task
    from transformer.training import checkpointing, sharding
    from transformer.training.optimizer import make_optimizer
    from transformer.training.resolve import resolve
    from transformer.training.state import abstract_state

    c = _config(corpus_dir)
    task, model_cfg = get_task(c), resolve(c, jax.device_count(), 1).model_cfg
    mesh, rules = sharding.make_mesh(c.mesh), sharding.rules(c.mesh)
    abstract, _ = abstract_state(build_model(model_cfg), make_optimizer(c.train), task.init_inputs(c), mesh, rules)
    it = task.make_iterator(c, split=c.data.train_split, global_batch_size=c.train.batch_size,
                            seed=c.data.shuffle_seed + c.train.seed, process_index=0, process_count=1)
    ckpt = checkpointing.Checkpointer(os.path.join(runs["at_stop"], "checkpoints"))
    try:
        step, state = ckpt.restore(abstract, it)
    finally:
        ckpt.close()
    assert step == STOP_AT and it.get_state() == {"next_batch": STOP_AT}
    restored = {_path_key(p): np.asarray(a) for p, a in jax.tree_util.tree_flatten_with_path(jax.device_get(state))[0]}
    saved = _saved(os.path.join(runs["at_stop"], "checkpoints", str(STOP_AT)))
    assert set(restored) == set(saved) and len(saved) > 10
    for key, array in saved.items():
        np.testing.assert_array_equal(restored[key], array, err_msg=key)


def _stopped_process(workdir: str, data_dir: str, process_id: int, port: int) -> None:
    """One process of the preempted 2-process run (the train CLI's set-up, then train with stop_at)."""
    from ml_collections import ConfigDict

    from experiments.jax_setup import setup_jax

    c = _config(data_dir)
    c.distributed = ConfigDict({**c.distributed.to_dict(), "coordinator_address": f"127.0.0.1:{port}",
                                "num_processes": 2, "process_id": process_id})
    setup_jax(c)
    from transformer.training import loop

    assert loop.train(c, workdir, stop_at=STOP_AT)["status"] == "preempted"


if __name__ == "__main__":
    _stopped_process(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
