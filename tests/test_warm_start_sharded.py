"""train.init_from restores the copied parameters straight into the new run's shardings (8 simulated devices,
parameters split over fsdp x tensor): orbax hands back only arrays already in the target layout (none whole on
one device), and every one holds the source checkpoint's values."""
from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding

from configs import lm
from transformer.models import build_model
from transformer.tasks import get_task
from transformer.training import sharding
from transformer.training.resolve import model_config
from transformer.training.optimizer import make_optimizer
from transformer.training.restore import latest_step
from transformer.training.state import init_state
from transformer.training.warm_start import warm_start


def _saved_params(run_dir: str) -> dict:
    """The source's parameters as saved: read by orbax as plain numpy (no shardings, no project code)."""
    path = os.path.join(run_dir, "checkpoints", str(latest_step(run_dir)), "state")
    tree = ocp.PyTreeCheckpointer().metadata(path).item_metadata.tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    saved = ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(restore_args=args))
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(saved["params"])}


def test_init_from_restores_into_the_target_shardings(tiny_lm_run, monkeypatch):
    c = lm.get_config("gpt2_tiny")
    c.data.seq_len = 32
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 4, 2
    model = build_model(model_config(c, 259))
    mesh, rules = sharding.make_mesh(c.mesh), sharding.rules(c.mesh)
    state, _ = init_state(model, make_optimizer(c.train), 1, get_task(c).init_inputs(c), mesh, rules)
    target = {jax.tree_util.keystr(p): x.sharding for p, x in jax.tree_util.tree_leaves_with_path(state.params)}
    assert sum(not s.is_fully_replicated for s in target.values()) >= 4  # the test needs split parameters

    handed_back = []  # the arrays orbax restored, as it returned them
    restore = ocp.Checkpointer.restore

    def recording(self, *args, **kwargs):
        out = restore(self, *args, **kwargs)
        handed_back.extend(x for x in jax.tree.leaves(out) if isinstance(x, jax.Array))
        return out

    monkeypatch.setattr(ocp.Checkpointer, "restore", recording)
    new, report = warm_start(state, tiny_lm_run)
    assert report["kept"] == [] and len(report["copied"]) == len(target)
    assert handed_back and all(isinstance(x.sharding, NamedSharding) and len(x.sharding.device_set) == 8
                               for x in handed_back), {str(x.sharding) for x in handed_back}
    saved = _saved_params(tiny_lm_run)
    for path, x in jax.tree_util.tree_leaves_with_path(new.params):
        key = jax.tree_util.keystr(path)
        assert x.sharding == target[key], key
        np.testing.assert_array_equal(np.asarray(x), saved[key], err_msg=key)
