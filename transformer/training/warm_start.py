"""Warm start: initialise a new run's parameters from another run's checkpoint (fine-tuning).

`train.init_from=DIR` (a finished or running train workdir): every parameter of the new model whose path
and shape also exist in DIR's latest checkpoint is copied, the rest (e.g. a classifier head replacing a
masked-LM head) keeps its fresh initialisation. The optimizer state starts fresh. Only used when the new
run has no checkpoint of its own; resuming always restores the run itself.

The copied parameters are restored straight into the new state's shardings (an orbax partial restore of
only the matching leaves, as the checkpointer restores a run): each device reads its own shards, and no
parameter is ever whole on one device.

`train.init_from=HF_DIR` (a local Hugging Face checkpoint directory: config.json with a `model_type`, as
`experiments.export` writes or a download holds; GPT-2, LLaMA, BERT, T5): its tensors, converted to this
codebase's parameter tree, are copied the same way (each put into its leaf's sharding). The model settings
must describe the checkpoint's model: a parameter whose shape differs is an error naming it, except the
token table and output head of a vocabulary padded to a multiple of 128 beyond the checkpoint's (its rows are
copied, the padding rows keep their initialisation). Reading that format is interop's (transformer/interop/
hf_warm_start.py), a layer above training: it registers its reader here (`register_reader`), and
experiments.train and experiments.sweep import it.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from transformer.spec import ConfigError
from transformer.training.restore import latest_step, load_config
from transformer.training.state import TrainState


def _leaves(tree: Any) -> dict[str, Any]:
    """keystr(path) → leaf, for a tree of arrays or of orbax's array metadata."""
    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _pruned(tree: Any) -> Any:
    """A nested mapping without its None leaves and the subtrees left empty (None when nothing is left)."""
    if not isinstance(tree, Mapping):
        return tree
    kept = {k: _pruned(v) for k, v in tree.items()}
    return {k: v for k, v in kept.items() if v is not None} or None


# "huggingface": (directory) -> this codebase's parameter tree of numpy arrays; registered by interop
READERS: dict[str, Callable[[str], Any]] = {}


def register_reader(name: str, read: Callable[[str], Any]) -> None:
    """Makes `read` the reader of checkpoint directories of format `name` (only "huggingface" is looked up)."""
    READERS[name] = read


def is_hf_checkpoint(path: str) -> bool:
    """A Hugging Face checkpoint directory: its config.json names a model_type (a train workdir's does not)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" in config and "train" not in config


def _vocab_padding(saved: tuple[int, ...], model: tuple[int, ...]) -> bool:
    """The model's shape is the checkpoint's with one axis padded up to the next multiple of 128 (the vocabulary,
    spec.model_spec): the token table's rows, an untied head's columns."""
    differ = [i for i, (a, b) in enumerate(zip(saved, model)) if a != b]
    if len(saved) != len(model) or len(differ) != 1:
        return False
    a, b = saved[differ[0]], model[differ[0]]
    return a < b and b % 128 == 0 and b - a < 128


def _hf_warm_start(state: TrainState, init_from: str) -> tuple[TrainState, dict[str, list[str]]]:
    """The matching tensors of a Hugging Face checkpoint (READERS["huggingface"]) put into `state`'s shardings."""
    if "huggingface" not in READERS:
        raise ConfigError(f"train.init_from={init_from!r} is a Hugging Face checkpoint; reading it needs "
                          f"`import transformer.interop.hf_warm_start` (experiments.train and experiments.sweep "
                          f"import it)")
    saved = _leaves(READERS["huggingface"](init_from))
    report: dict[str, list[str]] = {"copied": [], "kept": []}
    wrong: list[str] = []

    def take(path: Any, leaf: jax.Array) -> jax.Array:
        key = jax.tree_util.keystr(path)
        src = saved.get(key)
        if src is None:
            report["kept"].append(key)
            return leaf
        src = np.asarray(src)
        if src.shape != tuple(leaf.shape):
            if not _vocab_padding(src.shape, tuple(leaf.shape)):
                wrong.append(f"{key}: model {tuple(leaf.shape)}, checkpoint {src.shape}")
                return leaf
            padded = np.array(jax.device_get(leaf), dtype=leaf.dtype)  # the padding rows keep their init
            padded[tuple(slice(0, n) for n in src.shape)] = src
            src = padded
            report["kept"].append(f"{key} (the entries past the checkpoint's vocabulary)")
        report["copied"].append(key)
        return jax.device_put(src.astype(leaf.dtype), leaf.sharding)

    params = jax.tree_util.tree_map_with_path(take, state.params)
    if wrong:
        raise ConfigError(f"train.init_from={init_from!r}: the model settings do not describe this checkpoint's "
                          f"model ({'; '.join(wrong[:4])}{'; ...' if len(wrong) > 4 else ''}); set model.* as its "
                          f"config.json says (python -c 'from transformer.interop.hf import config_from_pretrained; "
                          f"print(config_from_pretrained(DIR))')")
    if not report["copied"]:
        raise ConfigError(f"train.init_from={init_from!r}: no parameter of this model matches that checkpoint's "
                          f"(path and shape); is it a checkpoint of the same family?")
    return state.replace(params=params), report


def warm_start(state: TrainState, init_from: str) -> tuple[TrainState, dict[str, list[str]]]:
    """Copies matching parameters from `init_from` (a train workdir or a Hugging Face checkpoint directory) into
    `state`, each restored in that leaf's sharding and dtype. Returns the new state and {"copied": [...],
    "kept": [...]} parameter paths.
    """
    if is_hf_checkpoint(init_from):
        return _hf_warm_start(state, init_from)
    try:
        load_config(init_from)  # DIR/config.json: it is a training run
        state_dir = os.path.join(init_from, "checkpoints", str(latest_step(init_from)), "state")
    except FileNotFoundError as e:
        raise ConfigError(f"train.init_from={init_from!r}: {e}") from None
    saved = ocp.PyTreeCheckpointHandler().metadata(epath.Path(state_dir))
    saved_params = _leaves(saved["params"] if isinstance(saved, dict) else saved.tree["params"])
    report: dict[str, list[str]] = {"copied": [], "kept": []}

    def wanted(path: Any, leaf: jax.Array) -> jax.ShapeDtypeStruct | None:
        key = jax.tree_util.keystr(path)
        src = saved_params.get(key)
        if src is None or tuple(src.shape) != tuple(leaf.shape):
            report["kept"].append(key)
            return None
        report["copied"].append(key)
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)

    item = _pruned(jax.tree_util.tree_map_with_path(wanted, state.params))  # only the leaves to copy
    if not report["copied"]:
        raise ConfigError(f"train.init_from={init_from!r}: no parameter of this model matches that run's "
                          f"(path and shape); is it a run of the same family and width?")
    item = {"params": item}
    restored = ocp.PyTreeCheckpointer().restore(state_dir, args=ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True))
    copied = _leaves(restored["params"])
    params = jax.tree_util.tree_map_with_path(lambda p, x: copied.get(jax.tree_util.keystr(p), x), state.params)
    return state.replace(params=params), report
