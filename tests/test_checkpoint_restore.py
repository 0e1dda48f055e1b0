"""Restore sets a checkpoint aside only on proven damage (tests/test_reliability.py covers the kinds of
damage); an error that is not damage, or a checkpoint of another parameter tree, is raised with nothing
moved, so a run never silently resumes from an older step."""
from __future__ import annotations

import os
import shutil

import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

from test_reliability import _restore, _tree_hash, tiny_config
from transformer.training import checkpointing
from transformer.training.loop import train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, corpus_dir) -> str:
    workdir = str(tmp_path_factory.mktemp("restore") / "run")
    assert train(tiny_config(corpus_dir), workdir, verbose=False)["status"] == "ok"
    return workdir


def _copy(run_dir: str, tmp_path) -> tuple[str, dict]:
    workdir = str(tmp_path / "run")
    shutil.copytree(run_dir, workdir)
    return workdir, _tree_hash(os.path.join(workdir, "checkpoints"))


def _nothing_moved(workdir: str, before: dict) -> None:
    assert _tree_hash(os.path.join(workdir, "checkpoints")) == before
    assert not os.path.exists(os.path.join(workdir, "unreadable_checkpoints"))


@pytest.mark.parametrize("error", [MemoryError("out of memory"), OSError(5, "Input/output error"),
                                   ValueError("UNAVAILABLE: the file system did not answer")])
def test_an_error_that_is_not_damage_is_raised_and_nothing_moved(error, run_dir, tmp_path, monkeypatch):
    workdir, before = _copy(run_dir, tmp_path)

    def fail(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(ocp.CheckpointManager, "restore", fail)
    with pytest.raises(type(error)) as raised:
        _restore(workdir)
    assert raised.value is error
    _nothing_moved(workdir, before)


def test_a_step_saved_with_the_version_1_digest_is_verified_with_it(run_dir, tmp_path):
    """Steps saved before the digest recorded its version hold version 1's: they restore (not set aside as
    damaged), and a wrong version-1 digest is still caught."""
    import json
    workdir, _ = _copy(run_dir, tmp_path)
    path = os.path.join(workdir, "checkpoints", "12", "meta", "metadata")
    meta = json.load(open(path))
    assert meta["digest_version"] == checkpointing.DIGEST_VERSION and meta["lr_arithmetic"] == 2
    step, state = _restore(workdir)
    old = {k: v for k, v in meta.items() if k not in ("digest_version", "lr_arithmetic")}
    json.dump({**old, "state_sha256": checkpointing.state_digest(state, version=1)}, open(path, "w"))
    assert _restore(workdir)[0] == 12 and not os.path.exists(os.path.join(workdir, "unreadable_checkpoints"))
    json.dump({**old, "state_sha256": meta["state_sha256"]}, open(path, "w"))  # a version-2 digest read as 1
    assert _restore(workdir)[0] == 8  # a mismatch: set aside as damage, the previous step restored


def test_a_changed_parameter_tree_names_the_paths_and_moves_nothing(run_dir, tmp_path):
    workdir, before = _copy(run_dir, tmp_path)
    with pytest.raises(checkpointing.CheckpointMismatch) as e:
        _restore(workdir, d_ff=128, num_layers=3)
    text = str(e.value)
    assert "checkpoint 12" in text
    assert "params/blocks/layers_2" in text and "(only in the model)" in text  # a layer added by the edit
    assert "mlp/wi/kernel (checkpoint (64, 256), model (64, 128))" in text      # a reshaped matrix
    _nothing_moved(workdir, before)
    assert _restore(workdir)[0] == 12  # the unchanged model still restores the newest step


def test_damage_is_recognised_through_orbax_wrapping():
    try:
        try:
            raise ValueError('OUT_OF_RANGE: Error reading "params.x/0.0" in OCDBT database')
        except ValueError as inner:
            raise Exception("Encountered error while reading array index") from inner
    except Exception as outer:  # noqa: BLE001
        assert checkpointing.is_damage(outer)
    assert not checkpointing.is_damage(Exception("RESOURCE_EXHAUSTED"))
    assert not checkpointing.is_damage(MemoryError())


# ---------------------------------------------------------------- the state digest (computed on device)

def _tree(seed: int = 0) -> dict:
    import numpy as np
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((16, 24)).astype(np.float32),
            "b": rng.standard_normal((24,)).astype(np.float32),
            "h": jnp.asarray(rng.standard_normal((8, 4)), dtype=jnp.bfloat16),
            "step": np.int32(7), "finite": np.bool_(True)}


def test_digest_changes_with_any_flipped_bit_or_swapped_elements():
    import numpy as np
    base = checkpointing.state_digest(_tree())
    assert base == checkpointing.state_digest(_tree())
    rng = np.random.default_rng(1)
    for _ in range(20):  # one flipped bit anywhere in the float32 matrix
        t = _tree()
        flat = t["w"].view(np.uint32).reshape(-1)
        flat[rng.integers(flat.size)] ^= np.uint32(1 << int(rng.integers(32)))
        assert checkpointing.state_digest(t) != base
    t = _tree()
    t["w"][[3, 5]] = t["w"][[5, 3]]  # two rows swapped: same multiset of values
    assert checkpointing.state_digest(t) != base
    t = _tree()
    t["h"] = t["h"].at[2, 1].set(t["h"][2, 1] * 2)  # a bfloat16 leaf
    assert checkpointing.state_digest(t) != base
    t = _tree()
    t["step"] = np.int32(8)
    assert checkpointing.state_digest(t) != base
    t = _tree()
    t["finite"] = np.bool_(False)  # a bool leaf (optax.apply_if_finite's state)
    assert checkpointing.state_digest(t) != base


def test_digest_changes_when_x_and_minus_x_swap_places():
    """Version 1 (a linear, position-weighted sum) missed these: bits(−x) = bits(x) + 2^31, and 2^31 times an
    even difference of weights vanishes mod 2^32. The default version catches them; version 1 is kept only to
    verify the steps it wrote."""
    import numpy as np
    t = _tree()
    t["w"][0, 0], t["w"][0, 1] = 0.75, -0.75
    base = checkpointing.state_digest(t)
    t["w"][0, 0], t["w"][0, 1] = -0.75, 0.75
    assert checkpointing.state_digest(t) != base
    for i, j in [(0, 1), (2, 7), (0, 383)]:  # x and −x swapped at other distances, in the flat index
        t = _tree()
        flat = t["w"].reshape(-1)
        flat[i], flat[j] = 1.5, -1.5
        base, v1 = checkpointing.state_digest(t), checkpointing.state_digest(t, version=1)
        flat[i], flat[j] = -1.5, 1.5
        assert checkpointing.state_digest(t) != base
        assert checkpointing.state_digest(t, version=1) == v1  # what version 1 could not see
    assert checkpointing.DIGEST_VERSION == 2


def test_digest_is_the_same_for_a_state_sharded_over_eight_devices():
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    t = _tree()
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
    sharded = {"w": jax.device_put(t["w"], NamedSharding(mesh, P("a", "b"))),
               "b": jax.device_put(t["b"], NamedSharding(mesh, P("a"))),
               "h": jax.device_put(t["h"], NamedSharding(mesh, P(None, "b"))),
               "step": t["step"], "finite": t["finite"]}
    assert checkpointing.state_digest(sharded) == checkpointing.state_digest(t)
    assert checkpointing.state_digest(sharded, version=1) == checkpointing.state_digest(t, version=1)
