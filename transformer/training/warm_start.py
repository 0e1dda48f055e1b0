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

`check_source` does every check (the path exists; a train workdir with a checkpoint, of the model's family, or a
Hugging Face directory whose tensors fit; some parameter matches) before the run writes anything
(run_setup.prepare), and `warm_start` then copies from the checked Source (a Hugging Face checkpoint is read once).
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from jax.sharding import NamedSharding, PartitionSpec as P

from transformer.layers import head_pruning
from transformer.spec import ConfigError, MissingInputError, pruning
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


@dataclasses.dataclass
class Source:
    """train.init_from, checked against a model before anything is written (check_source): `kind` "run" (a train
    workdir: `state_dir`, its latest checkpoint's state) or "huggingface" (`tensors`: the converted parameters,
    read once); `copied`/`kept`: the model's parameter paths (keystr) taken from it / left at their init;
    `shapes`: the model's parameter shapes by path; `heads`: the copied parameters of attention layers that keep
    fewer heads than the source's (model.pruned_heads), by path: (projection, parameter, the rows kept)."""
    path: str
    kind: str
    copied: list[str]
    kept: list[str]
    shapes: dict[str, tuple[int, ...]]
    state_dir: str | None = None
    tensors: dict[str, np.ndarray] | None = None
    heads: dict[str, tuple[str, str, tuple[list[int], list[int]]]] = dataclasses.field(default_factory=dict)
    saved_shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # heads' leaves, in the run

    def light(self) -> "Source":
        """This source without the tensors read (held only until the warm start used them; read again if needed)."""
        return dataclasses.replace(self, tensors=None)

    def report(self) -> dict[str, list[str]]:
        """{"copied": paths, "kept": paths}, a vocabulary padded beyond the checkpoint's named in both."""
        padded = [f"{k} (the entries past the checkpoint's vocabulary)" for k in self.copied
                  if self.tensors is not None and tuple(self.tensors[k].shape) != self.shapes[k]]
        return {"copied": list(self.copied), "kept": self.kept + padded}


def _head_rows(model_cfg: Any, src_pruned: str) -> dict[str, tuple[str, str, tuple[list[int], list[int]]]]:
    """{parameter path (keystr): (projection, parameter, rows)} of the attention parameters with a head axis in the
    layers where `model_cfg` keeps fewer heads than a source with model.pruned_heads = src_pruned."""
    if model_cfg is None:
        return {}
    out = {}
    for layer, rows in head_pruning.select(model_cfg, pruning.canonical(src_pruned), model_cfg.pruned_heads).items():
        prefix = "".join(f"[{k!r}]" for k in layer.split("/"))
        for (projection, name) in head_pruning.HEAD_AXES:
            out[f"{prefix}[{projection!r}][{name!r}]"] = (projection, name, rows)
    return out


def _gathered_shape(shape: tuple[int, ...], projection: str, name: str, rows: tuple) -> tuple[int, ...]:
    axis, kind = head_pruning.HEAD_AXES[(projection, name)]
    return shape[:axis] + (len(rows[0] if kind == "q" else rows[1]),) + shape[axis + 1:]


def check_source(init_from: str, params: Any, family: str | None = None, model_cfg: Any = None) -> Source:
    """Checks that `init_from` can warm-start a model whose parameters are `params` (arrays or abstract
    ShapeDtypeStructs): it exists, is a train workdir with a checkpoint (of the same model.family, when `family`
    is given) or a Hugging Face checkpoint directory whose tensors fit, and at least one parameter matches by
    path and shape. `model_cfg` (the model's ModelConfig): an attention layer it prunes (model.pruned_heads) takes
    the rows of the heads it keeps from the source's (unpruned, or less pruned) layer. Each failure is one
    ConfigError naming train.init_from; nothing is restored yet."""
    where = f"train.init_from={init_from!r}"
    if not os.path.isdir(init_from):
        raise MissingInputError(f"{where} does not exist (a train workdir, or a local Hugging Face model "
                                f"directory)" if not os.path.exists(init_from) else
                                f"{where} is not a directory (a train workdir, or a local Hugging Face model "
                                f"directory)")
    shapes = {k: tuple(x.shape) for k, x in _leaves(params).items()}
    if is_hf_checkpoint(init_from):
        return _hf_source(init_from, shapes, _head_rows(model_cfg, ""))  # a Hugging Face model has all its heads
    try:
        config = load_config(init_from)  # DIR/config.json: it is a training run
        state_dir = os.path.join(init_from, "checkpoints", str(latest_step(init_from)), "state")
    except MissingInputError as e:
        raise MissingInputError(f"{where}: {e}" + ("" if "checkpoint" in str(e) else
                                                   " (give a train workdir, or a local Hugging Face model "
                                                   "directory)")) from None
    theirs = (config.get("model") or {}).get("family", "decoder")
    if family is not None and theirs != family:
        raise ConfigError(f"{where} is a run of model.family={theirs!r} (task "
                          f"{(config.get('train') or {}).get('task') or 'its default'}); this model is {family!r}: "
                          f"warm-start from a run of the same family")
    saved = ocp.PyTreeCheckpointHandler().metadata(epath.Path(state_dir))
    saved_params = _leaves(saved["params"] if isinstance(saved, dict) else saved.tree["params"])
    heads = _head_rows(model_cfg, (config.get("model") or {}).get("pruned_heads", ""))

    def fits(k: str, shape: tuple[int, ...]) -> bool:
        saved_shape = tuple(saved_params[k].shape)
        return (_gathered_shape(saved_shape, *heads[k]) if k in heads else saved_shape) == shape

    copied = [k for k, shape in shapes.items() if k in saved_params and fits(k, shape)]
    if not copied:
        raise ConfigError(f"{where}: no parameter of this model matches that run's (path and shape); is it a run "
                          f"of the same family and width?")
    return Source(init_from, "run", copied, [k for k in shapes if k not in copied], shapes, state_dir=state_dir,
                  heads={k: v for k, v in heads.items() if k in copied},
                  saved_shapes={k: tuple(saved_params[k].shape) for k in heads if k in copied})


def _hf_source(init_from: str, shapes: dict[str, tuple[int, ...]], heads: dict | None = None) -> Source:
    """A Hugging Face checkpoint's converted tensors (READERS["huggingface"]) matched to the model's shapes; the
    attention layers the model prunes keep the rows of their heads (`heads`, _head_rows)."""
    if "huggingface" not in READERS:
        raise ConfigError(f"train.init_from={init_from!r} is a Hugging Face checkpoint; reading it needs "
                          f"`import transformer.interop.hf_warm_start` (experiments.train and experiments.sweep "
                          f"import it)")
    saved = {k: np.asarray(v) for k, v in _leaves(READERS["huggingface"](init_from)).items()}
    for k, (projection, name, rows) in (heads or {}).items():
        if k in saved:
            saved[k] = head_pruning.take_heads(projection, name, saved[k], rows)
    copied, kept, wrong = [], [], []
    for key, shape in shapes.items():
        src = saved.get(key)
        if src is None:
            kept.append(key)
        elif src.shape == shape or _vocab_padding(src.shape, shape):
            copied.append(key)
        else:
            wrong.append(f"{key}: model {shape}, checkpoint {src.shape}")
    if wrong:
        raise ConfigError(f"train.init_from={init_from!r}: the model settings do not describe this checkpoint's "
                          f"model ({'; '.join(wrong[:4])}{'; ...' if len(wrong) > 4 else ''}); set model.* as its "
                          f"config.json says (python -c 'from transformer.interop.hf import config_from_pretrained; "
                          f"print(config_from_pretrained(DIR))')")
    if not copied:
        raise ConfigError(f"train.init_from={init_from!r}: no parameter of this model matches that checkpoint's "
                          f"(path and shape); is it a checkpoint of the same family?")
    return Source(init_from, "huggingface", copied, kept, shapes, tensors={k: saved[k] for k in copied})


def warm_start(state: TrainState, init_from: str | Source) -> tuple[TrainState, dict[str, list[str]]]:
    """Copies matching parameters from `init_from` (a checked Source, or a path: checked here) into `state`, each
    restored in that leaf's sharding and dtype. Returns the new state and {"copied": [...], "kept": [...]}
    parameter paths."""
    source = init_from if isinstance(init_from, Source) else check_source(init_from, state.params)
    if source.kind == "huggingface" and source.tensors is None:  # released after the first use (light()): read again
        source = _hf_source(source.path, source.shapes, source.heads)
    if source.kind == "huggingface":
        def take(path: Any, leaf: jax.Array) -> jax.Array:
            src = source.tensors.get(jax.tree_util.keystr(path))
            if src is None:
                return leaf
            if src.shape != tuple(leaf.shape):  # a vocabulary padded beyond the checkpoint's
                padded = np.array(jax.device_get(leaf), dtype=leaf.dtype)  # the padding rows keep their init
                padded[tuple(slice(0, n) for n in src.shape)] = src
                src = padded
            return jax.device_put(src.astype(leaf.dtype), leaf.sharding)

        return state.replace(params=jax.tree_util.tree_map_with_path(take, state.params)), source.report()
    copy = set(source.copied)

    def wanted(path: Any, leaf: jax.Array) -> jax.ShapeDtypeStruct | None:
        key = jax.tree_util.keystr(path)
        if key not in copy:
            return None
        if key in source.heads:  # the source's (more heads): read whole, then its kept heads' rows taken
            saved_shape = source.saved_shapes[key]
            return jax.ShapeDtypeStruct(saved_shape, leaf.dtype, sharding=NamedSharding(leaf.sharding.mesh, P()))
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)

    item = {"params": _pruned(jax.tree_util.tree_map_with_path(wanted, state.params))}  # only the leaves to copy
    restored = ocp.PyTreeCheckpointer().restore(source.state_dir, args=ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True))
    copied = _leaves(restored["params"])
    targets = _leaves(state.params)
    for key, (projection, name, rows) in source.heads.items():
        rows_of = head_pruning.take_heads(projection, name, jax.device_get(copied[key]), rows)
        copied[key] = jax.device_put(rows_of.astype(targets[key].dtype), targets[key].sharding)
    params = jax.tree_util.tree_map_with_path(lambda p, x: copied.get(jax.tree_util.keystr(p), x), state.params)
    return state.replace(params=params), source.report()
