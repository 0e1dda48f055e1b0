"""Multi-host: 2 processes x 2 CPU devices on 127.0.0.1 (jax.distributed, the distributed.* keys) train
like 1 process x 4 devices fed the same global batches; checkpoints restore across process counts.

Run as a script, this file is the 1-process reference: `python tests/test_multihost.py WORKDIR DATA_DIR`
trains on 4 devices with an iterator that concatenates the two processes' shards, i.e. exactly the
global batch the 2-process run assembles from its per-process rows.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {"data.seq_len": 32, "train.steps": 8, "train.batch_size": 8, "train.warmup_steps": 1,
            "train.log_every": 2, "train.eval_every": 4, "train.eval_steps": 2, "train.checkpoint_every": 4}


def _cli(workdir: str, data_dir: str, devices: int, process: tuple[int, int, int] | None = None) -> subprocess.Popen:
    """The train CLI on `devices` CPU devices; `process` = (id, count, port) for a jax.distributed run."""
    cmd = [sys.executable, "-m", "experiments.train", "--config=configs/lm.py:gpt2_tiny", f"--workdir={workdir}",
           f"--config.data.data_dir={data_dir}", *(f"--config.{k}={v}" for k, v in SETTINGS.items())]
    if process is not None:
        pid, count, port = process
        cmd += [f"--config.distributed.coordinator_address=127.0.0.1:{port}",
                f"--config.distributed.num_processes={count}", f"--config.distributed.process_id={pid}"]
    env = {**os.environ, "PYTHONPATH": REPO, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _two_processes(workdir: str, data_dir: str) -> list[subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [_cli(workdir, data_dir, 2, (i, 2, port)) for i in range(2)]


def _wait(procs: list[subprocess.Popen]) -> str:
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=400)
        outs.append(out)
        assert p.returncode == 0, out[-3000:]
    return "\n".join(outs)


def _rows(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _reference(workdir: str, data_dir: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), workdir, data_dir], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_dir):
    base = tmp_path_factory.mktemp("multihost")
    two, one = str(base / "two"), str(base / "one")
    procs = _two_processes(two, corpus_dir) + [_reference(one, corpus_dir)]
    _wait(procs)
    return two, one


def test_two_processes_match_one_process_on_the_same_batches(runs):
    two, one = runs
    a, b = _rows(two), _rows(one)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [2, 4, 6, 8]  # process 0 alone wrote them
    diffs = [abs(x[k] - y[k]) for x, y in zip(a, b) for k in ("train_loss", "eval_loss") if k in x]
    print(f"largest |loss difference| 2 processes vs 1: {max(diffs):.3g} over {len(diffs)} values")
    assert len(diffs) == 6 and max(diffs) < 1e-4
    assert a[0]["train_loss"] != a[-1]["train_loss"]  # it trained
    summary = json.load(open(os.path.join(two, "summary.json")))
    assert summary["status"] == "ok" and summary["num_devices"] == 4
    data_files = sorted(os.listdir(os.path.join(two, "checkpoints", "8", "data")))
    assert data_files[:2] == ["commit_success.txt", "process_0-of-2.json"] and "process_1-of-2.json" in data_files


def _resume_copy(src: str, dst: str) -> None:
    """A copy of a finished run as if it had been stopped right after its step-4 checkpoint."""
    shutil.copytree(src, dst)
    shutil.rmtree(os.path.join(dst, "checkpoints", "8"))
    os.remove(os.path.join(dst, "summary.json"))


def _config(data_dir: str):
    from configs import lm

    c = lm.get_config("gpt2_tiny")
    c.data.data_dir = data_dir
    for key, value in SETTINGS.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def _path_key(path: tuple) -> str:
    """A key path as orbax names it on disk: attribute, dict key or sequence index, joined by '/'."""
    return "/".join(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path)


def _saved(step_dir: str) -> dict:
    """The state as saved: the checkpoint's arrays read by orbax as plain numpy (no shardings, no project code)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    path = os.path.join(step_dir, "state")
    tree = ocp.PyTreeCheckpointer().metadata(path).item_metadata.tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    saved = ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(restore_args=args))
    return {_path_key(p): np.asarray(a) for p, a in jax.tree_util.tree_flatten_with_path(saved)[0]}


def _restored_here(workdir: str, data_dir: str, merged_shards: bool) -> tuple[int, dict]:
    """The newest checkpoint restored the way the loop resumes (its abstract state and shardings; the
    checksum verified), in this process: 1 process, this session's 8 devices. `merged_shards`: the data
    iterator of the 1-process reference run (its saved position is the two shards' positions)."""
    import jax
    import numpy as np

    from transformer.models import build_model
    from transformer.tasks import get_task
    from transformer.training import checkpointing, sharding
    from transformer.training.optimizer import make_optimizer
    from transformer.training.resolve import resolve
    from transformer.training.state import abstract_state

    c = _config(data_dir)
    task, model_cfg = get_task(c), resolve(c, jax.device_count(), 1).model_cfg
    mesh, rules = sharding.make_mesh(c.mesh), sharding.rules(c.mesh)
    abstract, _ = abstract_state(build_model(model_cfg), make_optimizer(c.train), task.init_inputs(c), mesh, rules)
    data = dict(split=c.data.train_split, global_batch_size=c.train.batch_size, seed=c.data.shuffle_seed + c.train.seed,
                shuffle=True, repeat=True)
    it = (_MergedShards([task.make_iterator(c, **data, process_index=i, process_count=2) for i in range(2)])
          if merged_shards else task.make_iterator(c, **data, process_index=0, process_count=1))
    ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
    try:
        step, state = ckpt.restore(abstract, it)
    finally:
        ckpt.close()
    leaves = jax.tree_util.tree_flatten_with_path(jax.device_get(state))[0]
    return step, {_path_key(p): np.asarray(a) for p, a in leaves}


def test_checkpoints_restore_across_process_counts(runs, corpus_dir, tmp_path):
    """2-process checkpoint → 1 process, and 1-process checkpoint → 2 processes: the state restores
    (its checksum is verified on restore), the data iterator starts over on the new shards. Restored under
    another process/device count, every array equals what was saved, bit for bit."""
    import numpy as np

    two, one = runs
    for source, merged in ((two, False), (one, True)):  # written by 2 processes x 2 devices, 1 process x 4 devices
        workdir = str(tmp_path / f"restore_{os.path.basename(source)}")
        shutil.copytree(source, workdir)
        step, restored = _restored_here(workdir, corpus_dir, merged)
        saved = _saved(os.path.join(workdir, "checkpoints", str(step)))
        assert step == 8 and set(restored) == set(saved) and len(saved) > 10, (sorted(restored), sorted(saved))
        for key, array in saved.items():
            np.testing.assert_array_equal(restored[key], array, err_msg=f"{workdir}: {key}")
    _resume_copy(two, str(tmp_path / "two_to_one"))
    _resume_copy(one, str(tmp_path / "one_to_two"))
    out = _wait([_cli(str(tmp_path / "two_to_one"), corpus_dir, 4)])
    out += _wait(_two_processes(str(tmp_path / "one_to_two"), corpus_dir))
    assert out.count("resuming from step 4") == 2, out
    assert out.count("written by another number of processes") == 2, out
    for d in ("two_to_one", "one_to_two"):
        assert json.load(open(tmp_path / d / "summary.json"))["status"] == "ok"
        assert [r["step"] for r in _rows(str(tmp_path / d))] == [2, 4, 6, 8]


class _MergedShards:
    """The global batch of a 2-process run: process 0's rows, then process 1's."""

    def __init__(self, parts):
        self.parts = parts

    def __iter__(self):
        return self

    def __next__(self):
        import numpy as np

        batches = [next(p) for p in self.parts]
        return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}

    def get_state(self) -> bytes:
        return json.dumps([p.get_state() for p in self.parts]).encode()

    def set_state(self, state: bytes) -> None:
        for p, s in zip(self.parts, json.loads(state)):
            p.set_state(s)

    def start_prefetch(self) -> None:
        pass


def _reference_main(workdir: str, data_dir: str) -> None:
    from transformer.tasks import get_task
    from transformer.training import loop

    c = _config(data_dir)
    task = get_task(c)

    class TwoShards(type(task)):
        def make_iterator(self, config, **kw):
            kw = {**kw, "process_count": 2, "global_batch_size": kw["global_batch_size"]}
            return _MergedShards([super(TwoShards, self).make_iterator(config, **{**kw, "process_index": i})
                                  for i in range(2)])

    merged = TwoShards.__new__(TwoShards)
    merged.__dict__.update(task.__dict__)
    loop.get_task = lambda config: merged
    assert loop.train(c, workdir, verbose=True)["status"] == "ok"


if __name__ == "__main__":
    _reference_main(*sys.argv[1:3])
