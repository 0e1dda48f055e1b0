"""experiments.heads on a trained BERT-shaped run: the importance table, the heat map, the heads to prune, the
curve; and the pruned model trained from the run (train.init_from + model.pruned_heads) starts from exactly the
run's kept heads."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import mlm
from transformer.layers import head_pruning
from transformer.spec import pruning
from transformer.training.loop import train
from transformer.training.restore import load_run
from xla_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(corpus_dir: str, steps: int):
    c = mlm.get_config("default")
    c.model.update(dict(num_heads=4, num_layers=2))
    c.data.data_dir, c.data.seq_len = corpus_dir, 32
    c.train.update(dict(steps=steps, batch_size=8, warmup_steps=1, log_every=steps, eval_every=steps, eval_steps=2,
                        checkpoint_every=steps))
    return c


def _heads(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, XLA_FLAGS=xla_flags(1))
    return subprocess.run([sys.executable, "-m", "experiments.heads", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_heads_command_and_pruned_fine_tuning(tmp_path, corpus_dir):
    run = str(tmp_path / "bert")
    assert train(_config(corpus_dir, 4), run, verbose=False)["status"] == "ok"

    bad = _heads(f"--workdir={run}", "--prune=0.9")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: --prune=0.9")
    assert not os.path.exists(os.path.join(run, "heads"))

    proc = _heads(f"--workdir={run}", "--prune=0.25", "--curve=0,0.25,0.5", "--batches=2")
    assert proc.returncode == 0, proc.stderr
    out = os.path.join(run, "heads")
    assert sorted(os.listdir(out)) == ["curve.json", "curve.png", "heads.png", "importance.csv", "importance.json",
                                       "pruned_heads.json"]
    table = json.load(open(os.path.join(out, "importance.json")))
    layers = ["encoder/blocks/layers_0/attention", "encoder/blocks/layers_1/attention"]
    assert table["layers"] == layers and table["heads"] == {k: 4 for k in layers}
    assert all(abs(np.linalg.norm(table["normalized"][k]) - 1) < 1e-5 for k in layers)
    flat = sorted((table["normalized"][k][h], k, h) for k in layers for h in range(4))
    assert [[k, h] for _, k, h in flat] == table["order"]
    pruned = json.load(open(os.path.join(out, "pruned_heads.json")))
    assert sum(len(h) for h in pruned.values()) == 2  # a quarter of 8 heads, the least important
    curve = json.load(open(os.path.join(out, "curve.json")))
    assert [r["removed"] for r in curve["importance"]] == [r["removed"] for r in curve["random"]] == [0, 2, 4]
    assert curve["importance"][0]["loss"] == curve["random"][0]["loss"]

    c = _config(corpus_dir, 1)
    c.train.learning_rate = 1e-12  # one step that moves nothing: the run shows where it started
    c.train.init_from, c.model.pruned_heads = run, json.dumps(pruned)
    summary = train(c, str(tmp_path / "pruned"), verbose=False)
    assert summary["status"] == "ok" and summary["params"] < json.load(open(f"{run}/summary.json"))["params"]
    base, fine = load_run(run), load_run(str(tmp_path / "pruned"))
    want = head_pruning.prune_params(base.model_cfg, base.params, pruning.canonical(pruned))
    got = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(fine.params)}
    for path, x in jax.tree_util.tree_leaves_with_path(want):
        np.testing.assert_allclose(got[jax.tree_util.keystr(path)], np.asarray(x), atol=1e-6)
