"""Each process feeds the rows of the global batch its devices hold, derived from the batch sharding
(issue 19, hole 12): with a tensor or fsdp axis across processes, replicas of one batch shard live in
several processes, and each must feed those same rows (not rows [p·B, (p+1)·B)).

The index computation is tested on 8 simulated devices split into two pretend processes (devices 0-3 and
4-7); the mesh layouts put the tensor (or fsdp) axis across them by placing the devices by hand."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from test_data_files import _texts, data_config, write_mixed_folder

from configs.common import base_config
from transformer.data import batches, mlm, pipeline
from transformer.training import sharding

G = 16  # global batch rows


def _rows_by_process(layout_DFT: np.ndarray) -> dict[int, batches.RowBlocks]:
    """Row blocks of each pretend process (device id // 4) under the default rules' batch sharding."""
    devices = np.asarray(jax.devices())[layout_DFT]
    mesh = Mesh(devices, sharding.MESH_AXES)
    batch_s = sharding.batch_sharding(mesh, sharding.rules(base_config().mesh))
    indices = batch_s.devices_indices_map((G, 8))
    return {p: batches.rows_from_indices([i for d, i in indices.items() if d.id // 4 == p], G) for p in (0, 1)}


def test_data_axis_across_processes_gives_each_its_half():
    layout = np.arange(8).reshape(2, 1, 4)  # data index 0: devices 0-3 (process 0); tensor within a process
    assert _rows_by_process(layout) == {0: ((0, 8),), 1: ((8, 16),)}
    assert _rows_by_process(layout)[1] == batches.default_rows(G, 1, 2)  # the old rule, right here


def test_tensor_axis_across_processes_gives_each_the_whole_batch():
    layout = np.array([[[t * 4 + d] for t in range(2)] for d in range(4)]).reshape(4, 1, 2)  # tensor t: process t
    assert _rows_by_process(layout) == {0: ((0, G),), 1: ((0, G),)}


def test_fsdp_and_data_within_tensor_across_processes():
    layout = np.array([[[t * 4 + d * 2 + f for t in range(2)] for f in range(2)] for d in range(2)])
    assert _rows_by_process(layout) == {0: ((0, G),), 1: ((0, G),)}


def test_a_process_holding_two_separate_shards_feeds_both_blocks_in_order():
    layout = np.array([[(d % 2) * 4 + (d // 2) * 2 + t for t in range(2)] for d in range(4)]).reshape(4, 1, 2)
    assert _rows_by_process(layout) == {0: ((0, 4), (8, 12)), 1: ((4, 8), (12, 16))}


def test_one_process_feeds_every_row_of_its_sharding():
    mesh = sharding.make_mesh(base_config().mesh.copy_and_resolve_references(), jax.devices())
    batch_s = sharding.batch_sharding(mesh, sharding.rules(base_config().mesh))
    assert batches.process_rows(batch_s, (G, 8)) == ((0, G),) == batches.default_rows(G, 0, 1)


@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_row_blocks_read_those_rows_of_the_global_batch(task, tmp_path):
    """A process's blocks of rows are the global batch's rows, masks included (drawn per global row)."""
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(60))
    cfg = data_config(tmp_path, folder)
    make = pipeline.make_lm_iterator if task == "lm" else mlm.make_mlm_iterator
    kw = dict(split=cfg.train_split, global_batch_size=G, seed=3)
    whole, part = make(cfg, **kw), make(cfg, rows=((0, 4), (8, 12)), **kw)
    for _ in range(3):
        w, p = next(whole), next(part)
        for k in w:
            np.testing.assert_array_equal(p[k], np.concatenate([w[k][0:4], w[k][8:12]]), err_msg=k)


@pytest.mark.slow
def test_two_processes_with_the_tensor_axis_across_them_train_like_one(tmp_path, corpus_dir):
    """2 processes x 2 CPU devices with mesh tensor=4 (the tensor axis spans the processes; the batch is not
    sharded, every device holds all rows): both processes feed every row and the run equals 1 process x 4
    devices. Feeding rows [p·B, (p+1)·B) gave each process half a batch that is not the other's replica."""
    import subprocess
    import sys

    from test_multihost import REPO, _distributed, _env, _free_port, _rows, _wait

    settings = {"data.data_dir": corpus_dir, "data.seq_len": 32, "train.steps": 4, "train.batch_size": 8,
                "train.warmup_steps": 1, "train.log_every": 2, "train.eval_every": 4, "train.eval_steps": 1,
                "train.checkpoint_every": 4, "mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 4}

    def cli(workdir: str, devices: int, process: tuple[int, int, int] | None = None) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "experiments.train", "--config=configs/lm.py:gpt2_tiny", f"--workdir={workdir}",
               *(f"--config.{k}={v}" for k, v in settings.items()), *(_distributed(*process) if process else [])]
        return subprocess.Popen(cmd, cwd=REPO, env=_env(devices), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    one, two, port = str(tmp_path / "one"), str(tmp_path / "two"), _free_port()
    _wait([cli(two, 2, (i, 2, port)) for i in range(2)] + [cli(one, 4)])
    losses = [[r["train_loss"] for r in _rows(d)] for d in (one, two)]
    assert len(losses[0]) == 2
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
