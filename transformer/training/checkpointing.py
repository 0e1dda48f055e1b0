"""orbax checkpoints of the train state, the data-iterator position, the resolved config and a checksum.

Layout: DIR/checkpoints/<step>/{state,data,config,meta}. Saves are asynchronous (training continues
while the arrays are written). orbax writes each step into a temporary directory, adds
`commit_success.txt`, then renames it into place, so an unfinished save is never listed and is removed
on the next start; a listed step without the marker was damaged afterwards and counts as unreadable.
`data/process_I-of-N.json` holds each process's data-iterator state: the next global batch index,
the same in every process, so a step written by N processes restores under any other count.

`meta` holds a digest of the whole state (state_digest: a checksum per array computed on its devices, hashed),
verified after every restore: orbax/TensorStore catch missing and truncated files but not flipped bytes
inside an array chunk, which would otherwise restore silently wrong. It also records `digest_version` (the
checksum that wrote it; steps saved before the version was recorded are verified with version 1) and
`lr_arithmetic` (spec.LR_ARITHMETIC: how the learning rate of a step was computed; `arithmetic_of`).

Restoring takes the newest readable step. Only PROVEN damage makes a step unreadable: no commit marker,
no data-iterator state, a checksum mismatch, or TensorStore reporting a missing, truncated or undecodable
file (its DAMAGE_STATUSES). Such a step is moved, never deleted, to DIR/unreadable_checkpoints/ with a
warning, and the previous step is tried; when checkpoints exist but none is readable, restore raises
instead of starting over. A checkpoint whose parameter tree differs from the model's (a code edit) is a
CheckpointMismatch naming the differing paths; any other failure (out of memory, a file-system error, a
bug) is raised as it is. In both cases nothing is moved.
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
import time
from typing import Any, Sequence

import grain
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers
from etils import epath

from transformer.spec import LR_ARITHMETIC, ConfigError

log = logging.getLogger(__name__)

COMMIT_MARKER = "commit_success.txt"
_GOLDEN = 0x9E3779B1  # an odd multiplier (2^32 / golden ratio)
DIGEST_VERSION = 2  # the checksum new steps record; restore verifies a step with the one it recorded


def _fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 that mixes every input bit into every output bit."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _leaf_checksum(x: jax.Array, version: int = DIGEST_VERSION) -> jax.Array:
    """uint32: a sum over elements mod 2^32 of a function of each element's bits and its flat index i.

    Version 2: fmix32(bits(x_i) + i·GOLDEN). For each i that is a bijection of the element's bits, so a changed
    element always changes the sum; and it is not linear, so moving values between positions (two elements
    swapped, x and −x swapped, a row shifted) changes it too, but for a chance of about 2^-32. Version 1 (steps
    saved before: verified as they were written): bits(x_i)·(2·i·GOLDEN + 1), linear, so a swap of values whose
    bits differ by 2^31 — x and −x — cancelled out. Integer sums mod 2^32 do not depend on the order of the
    reduction, so either value is the same on any mesh or process count."""
    if x.dtype == jnp.bool_:  # e.g. optax.apply_if_finite's last_finite
        u = x.astype(jnp.uint32)
    else:
        bits = {4: jnp.uint32, 2: jnp.uint16, 1: jnp.uint8}[x.dtype.itemsize]
        u = jax.lax.bitcast_convert_type(x, bits).astype(jnp.uint32)
    index = jax.lax.broadcasted_iota(jnp.uint32, x.shape, 0) if x.ndim else jnp.zeros((), jnp.uint32)
    for axis in range(1, x.ndim):  # the row-major flat index, built without a reshape of the sharded array
        index = index * jnp.uint32(x.shape[axis]) + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis)
    if version == 1:
        return jnp.sum(u * (index * jnp.uint32((2 * _GOLDEN) & 0xFFFFFFFF) + jnp.uint32(1)), dtype=jnp.uint32)
    return jnp.sum(_fmix32(u + index * jnp.uint32(_GOLDEN)), dtype=jnp.uint32)


_checksums = {v: jax.jit(lambda leaves, v=v: [_leaf_checksum(x, v) for x in leaves]) for v in (1, 2)}


def state_digest(state: Any, version: int = DIGEST_VERSION) -> str:
    """SHA-256 over every leaf's path, dtype, shape and device-side checksum (_leaf_checksum of `version`).

    Computed where the arrays live (one jitted pass, sharded like the state); only one uint32 per leaf
    reaches the host, so no process gathers another's shards and the cost does not grow with the model
    the way hashing its bytes on one host did. The same for any mesh or process count."""
    paths_leaves = jax.tree_util.tree_leaves_with_path(state)
    sums = jax.device_get(_checksums[version]([x for _, x in paths_leaves]))
    h = hashlib.sha256()
    for (path, x), c in zip(paths_leaves, sums):
        h.update(f"{jax.tree_util.keystr(path)}{x.dtype}{tuple(x.shape)}{int(c)}".encode())
    return h.hexdigest()


class UnreadableCheckpoint(Exception):
    """A listed checkpoint step that fails a check of ours (marker, data files, checksum)."""


class CheckpointMismatch(ConfigError):
    """The checkpoint holds another parameter tree than the model builds (a code or config edit): not damage."""


# TensorStore's status codes for a file that is missing (FAILED_PRECONDITION / NOT_FOUND inside an OCDBT
# database), truncated (OUT_OF_RANGE) or undecodable (DATA_LOSS); orbax wraps them in a plain Exception.
DAMAGE_STATUSES = ("FAILED_PRECONDITION:", "NOT_FOUND:", "OUT_OF_RANGE:", "DATA_LOSS:")


def is_damage(error: BaseException) -> bool:
    """Whether `error` (or an exception it was raised from) proves the checkpoint's files are damaged."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, UnreadableCheckpoint):
            return True
        if isinstance(error, ValueError) and str(error).startswith(DAMAGE_STATUSES):
            return True
        error = error.__cause__ or error.__context__
    return False


def _leaf_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """'params/blocks/layers_0/...' -> shape, for any pytree of arrays or array metadata."""
    def name(k: Any) -> str:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                return str(getattr(k, attr))
        return str(k)
    return {"/".join(name(k) for k in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def tree_differences(saved: Any, expected: Any, limit: int = 8) -> list[str]:
    """The paths where two trees differ: only in the checkpoint, only in the model, or in shape."""
    a, b = _leaf_shapes(saved), _leaf_shapes(expected)
    first = lambda p: (not p.startswith("params/"), p)  # parameters first; the optimizer state mirrors them
    diffs = [f"{p} (only in the checkpoint)" if p not in b else f"{p} (only in the model)" if p not in a else
             f"{p} (checkpoint {a[p]}, model {b[p]})" for p in sorted(set(a) | set(b), key=first)
             if a.get(p) != b.get(p)]
    return diffs[:limit] + ([f"... {len(diffs) - limit} more"] if len(diffs) > limit else [])


class Checkpointer:
    """`keep`: the newest steps kept; `preserve`: steps never removed (a wsd run's decay start, from which a
    longer run or a sweep's branch continues)."""

    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True, preserve: Sequence[int] = ()):
        self.directory = os.path.abspath(directory)
        policy = checkpoint_managers.AnyPreservationPolicy([checkpoint_managers.LatestN(keep),
                                                            checkpoint_managers.CustomSteps(list(preserve))])
        options = ocp.CheckpointManagerOptions(preservation_policy=policy, enable_async_checkpointing=async_save,
                                               create=True, cleanup_tmp_directories=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any, data_iterator: Any, config: dict, *, force: bool = False) -> bool:
        meta = {"step": int(step), "process_count": jax.process_count(), "state_sha256": state_digest(state),
                "digest_version": DIGEST_VERSION, "lr_arithmetic": LR_ARITHMETIC}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  data=grain.checkpoint.CheckpointSave(data_iterator),
                                  config=ocp.args.JsonSave(config), meta=ocp.args.JsonSave(meta))
        return self.manager.save(step, args=args, force=force)

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def meta(self, step: int) -> dict | None:
        """The `meta` item of `step` (step, process_count, state_sha256, digest_version, lr_arithmetic; older
        steps lack the last two), or None when it has none."""
        path = os.path.join(self._step_dir(step), "meta", "metadata")
        if not os.path.exists(path):
            return None
        try:
            with open(path) as f:
                meta = json.load(f)
        except ValueError as e:
            raise UnreadableCheckpoint(f"its meta item is not JSON ({e})") from e
        return meta if isinstance(meta, dict) else None

    def _data_state(self, step: int) -> str | None:
        """The saved data-iterator state: this process's file, else (another process count wrote the step)
        process 0's. The project's iterators save the next global batch index, the same in every file
        (data/batches.py), so it restores under any process count. None: no state was saved."""
        data = os.path.join(self._step_dir(step), "data")
        mine = os.path.join(data, f"process_{jax.process_index()}-of-{jax.process_count()}.json")
        found = [mine] if os.path.exists(mine) else sorted(glob.glob(os.path.join(data, "process_0-of-*.json")))
        if not found:
            return None
        with open(found[0]) as f:
            return f.read()

    def _restore_step(self, step: int, abstract_state: Any, data_iterator: Any) -> Any:
        step_dir = self._step_dir(step)
        if not os.path.exists(os.path.join(step_dir, COMMIT_MARKER)):
            raise UnreadableCheckpoint(f"{COMMIT_MARKER} is missing (an unfinished or damaged save)")
        data_state = self._data_state(step)
        if data_state is None:
            raise UnreadableCheckpoint("the data-iterator state is missing")
        try:
            saved = ocp.PyTreeCheckpointHandler().metadata(epath.Path(os.path.join(step_dir, "state")))
        except Exception as e:  # noqa: BLE001 - classified: damage or not
            if is_damage(e) or isinstance(e, (FileNotFoundError, json.JSONDecodeError)):
                raise UnreadableCheckpoint(f"its tree metadata is unreadable ({type(e).__name__}: {e})") from e
            raise
        diffs = tree_differences(saved, abstract_state)
        if diffs:
            raise CheckpointMismatch(
                f"checkpoint {step} in {self.directory} holds another parameter tree than this model builds: "
                f"{'; '.join(diffs)}. Restore it with the code and config that wrote it, or train in a new "
                f"workdir (nothing was moved or deleted)")
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
        meta = self.meta(step)
        if meta:
            expected = meta.get("state_sha256")
            if expected is not None:
                got = state_digest(restored["state"], int(meta.get("digest_version", 1)))
                if got != expected:
                    raise UnreadableCheckpoint(f"state checksum mismatch ({got[:12]} != saved {expected[:12]}): "
                                               f"the array files were altered after the save")
        try:  # as grain.checkpoint.CheckpointRestore hands it over: parsed for a grain iterator, else bytes
            parsed = json.loads(data_state) if isinstance(data_iterator, grain.DatasetIterator) else data_state.encode()
        except json.JSONDecodeError as e:
            raise UnreadableCheckpoint(f"the data-iterator state is not JSON ({e})") from e
        data_iterator.set_state(parsed)
        return restored["state"]

    def _set_aside(self, step: int) -> str:
        """Moves an unreadable step out of orbax's sight (kept for inspection); returns where to."""
        target = os.path.join(os.path.dirname(self.directory), "unreadable_checkpoints", f"{step}-{int(time.time())}")
        if jax.process_index() == 0:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(self._step_dir(step), target)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices(f"set_aside_{step}")
        self.manager.reload()
        return target

    def set_aside_after(self, step: int, why: str) -> list[int]:
        """Moves every step after `step` to DIR/superseded_checkpoints/ (kept, never deleted): a wsd run
        continued to more steps resumes from its decay start, and the old decay's steps are not its past."""
        later = [s for s in self.steps() if s > step]
        for s in later:
            target = os.path.join(os.path.dirname(self.directory), "superseded_checkpoints", f"{s}-{int(time.time())}")
            if jax.process_index() == 0:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.move(self._step_dir(s), target)
        if later:
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils
                multihost_utils.sync_global_devices(f"superseded_{step}")
            self.manager.reload()
            if jax.process_index() == 0:
                print(f"{why}: moved checkpoints {later} to {os.path.dirname(self.directory)}/superseded_checkpoints/",
                      flush=True)
        return later

    def restore(self, abstract_state: Any, data_iterator: Any) -> tuple[int, Any] | None:
        """Restores the newest readable step into `abstract_state`'s shardings and `data_iterator`.

        Returns (step, state), or None when there is no checkpoint. A damaged step (see is_damage) is moved
        to DIR/unreadable_checkpoints/ with a warning and the previous one is tried; CheckpointMismatch and
        any error that is not damage are raised with nothing moved; if every step is damaged,
        raises RuntimeError rather than silently starting from scratch. The iterator is set to the saved
        position (see _data_state: under any process count).
        """
        steps = self.steps()
        errors = []
        for step in reversed(steps):
            try:
                state = self._restore_step(step, abstract_state, data_iterator)
            except Exception as e:  # noqa: BLE001 - only proven damage sets a step aside
                if not is_damage(e):
                    raise  # out of memory, a file-system error, a tree mismatch, a bug: nothing is moved
                msg = f"step {step}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                errors.append(msg)
                if step == steps[0]:
                    break  # keep the oldest: with nothing left, the error is the user's to look at
                target = self._set_aside(step)
                warning = (f"warning: checkpoint {step} in {self.directory} is unreadable ({msg}); moved it to "
                           f"{target} and trying the previous one")
                log.warning(warning)
                if jax.process_index() == 0:
                    print(warning, flush=True)
                continue
            if errors:
                log.warning("restored step %d after skipping unreadable checkpoints: %s", step, errors)
            return step, state
        if errors:
            raise RuntimeError(f"no readable checkpoint in {self.directory} (nothing was deleted; remove the "
                               f"directory to start over): " + "; ".join(errors))
        return None

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
