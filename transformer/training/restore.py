"""Load a training run's model for inference: config, tokenizer and parameters only.

A run directory (transformer/training/loop.py) holds DIR/config.json (the resolved config) and
DIR/checkpoints/<step>/state, an orbax StandardSave of TrainState(step, params, opt_state). Only the
`params` subtree is read (orbax partial restore), so no optimizer is built and its moments are never
loaded; the parameters land on one device. The recorded config is read as a plain dict and its RunSpec
(spec/run.py), never as a ConfigDict.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import flax.linen as nn
import jax
import orbax.checkpoint as ocp

from transformer.data import Tokenizer, get_tokenizer
from transformer.models import build_model
from transformer.spec import MissingInputError, ModelConfig, RunSpec

from transformer.tasks import get_task
from transformer.training.resolve import model_config
from transformer.training.run_io import read_run_json


@dataclasses.dataclass(frozen=True)
class LoadedRun:
    """config: DIR/config.json as a plain nested dict; spec: its RunSpec (spec.data, spec.train, spec.model)."""

    config: dict
    spec: RunSpec
    model_cfg: ModelConfig
    model: nn.Module
    params: Any
    tokenizer: Tokenizer
    step: int


def load_config(workdir: str) -> dict:
    """DIR/config.json as a plain nested dict; FileNotFoundError (one line) when the run is missing."""
    if not os.path.isdir(workdir):
        raise MissingInputError(f"--workdir={workdir} does not exist")
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise MissingInputError(f"{path} not found: {workdir} is not a training run directory")
    return read_run_json(path)


def recorded_spec(config: dict) -> RunSpec:
    """The RunSpec of a recorded config (config.json) for inference on this host: the mesh is taken at the size
    its fixed axes name (a -1 axis: one device), so the recorded run's checks hold as they did when it trained."""
    fixed = [int(config["mesh"][a]) for a in ("data", "fsdp", "tensor") if int(config["mesh"].get(a, 1)) > 0]
    return RunSpec.from_dict(config, num_devices=math.prod(fixed) if fixed else 1)


def latest_step(workdir: str) -> int:
    """The newest finalised checkpoint step; FileNotFoundError when there is none."""
    directory = os.path.join(workdir, "checkpoints")
    steps = sorted(ocp.utils.checkpoint_steps(directory)) if os.path.isdir(directory) else []
    if not steps:
        raise MissingInputError(f"no checkpoint in {directory}; train first (python -m experiments.train ...)")
    return steps[-1]


def restore_params(model: nn.Module, init_inputs: tuple, state_dir: str) -> Any:
    """The `params` subtree of a saved TrainState, shaped by `model.init(*init_inputs)`, on one device."""
    boxed = jax.eval_shape(lambda r: model.init(r, *init_inputs), jax.random.PRNGKey(0))["params"]
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    item = {"params": jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                                   nn.unbox(boxed))}
    restored = ocp.PyTreeCheckpointer().restore(state_dir, args=ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True))
    return restored["params"]


def load_run(workdir: str, *, step: int | None = None, model_kwargs: dict | None = None) -> LoadedRun:
    """The run's model and parameters at `step` (default: the latest checkpoint).

    model_kwargs: extra module fields, e.g. {"sow_attention_weights": True} for a DecoderLM. `workdir` may be
    relative (to the working directory); orbax is given it absolute.
    """
    workdir = os.path.abspath(os.path.expanduser(workdir))
    config = load_config(workdir)
    step = latest_step(workdir) if step is None else step
    state_dir = os.path.join(workdir, "checkpoints", str(step), "state")
    if not os.path.isdir(state_dir):
        raise MissingInputError(f"checkpoint {state_dir} not found")
    spec = recorded_spec(config)
    tokenizer = get_tokenizer(spec.data, workdir=workdir)  # the copy the run recorded
    model_cfg = model_config(config, tokenizer.vocab_size)
    model = build_model(model_cfg)
    if model_kwargs:
        model = model.clone(**model_kwargs)
    params = restore_params(model, get_task(spec).init_inputs(spec), state_dir)
    return LoadedRun(config, spec, model_cfg, model, params, tokenizer, step)
