"""The one resolve step: a training config (ConfigDict) + devices + tokenizer → the checked run spec
(transformer/spec), before any data is read or anything is compiled.

Every plain-value check lives in the spec constructors (ModelConfig, TrainSpec, MeshSpec, RunSpec); what needs
the layers stays here: the registry names (positional, activation, norm, attention_impl) and attention_impl="auto"
(models.resolve), and the logging settings (profiler, W&B). Each failure raises ConfigError naming the setting.
The config is read by item access, so a ConfigDict (the command lines) and a plain nested dict (a sweep's run
config from sweep.json) are resolved alike.
"""
from __future__ import annotations

import dataclasses
import copy
import os
import types
from typing import Any, Mapping

from transformer.data import get_tokenizer
from transformer.data.identity import IDENTITY_KEY, RunData, check_same, check_settings, resolvable, resolve_data
from transformer.models import resolve as resolve_names
from transformer.spec import (AUTO_WARMUP, ConfigError, DataSpec, MeshSpec, ModelConfig, RunSpec, TrainSpec, model_spec,
                              eval_tasks, run_task, warmup_steps)
from transformer.tasks import model_vocab_size
from transformer.training import profiler, wandb_run
from transformer.training.run_io import read_run_json


@dataclasses.dataclass(frozen=True)
class Resolved:
    """model_cfg: the validated ModelConfig; mesh_shape: (data, fsdp, tensor); config: the dict written to
    DIR/config.json (the config with model.vocab_size filled in from the tokenizer where it was 0, and
    data.tokenizer_fingerprint and data.identity); spec: all of it as a RunSpec; data: the run's resolved data
    (identity.RunData: tokenizer, fingerprints, cache), None in a dry run whose tokenizer or documents are not
    built yet."""

    model_cfg: ModelConfig
    mesh_shape: tuple[int, ...]
    config: dict
    spec: RunSpec
    data: RunData | None = None


def plain_config(config: Any) -> dict:
    """A ConfigDict or nested mapping as a plain nested dict (a copy; sequences kept as they are)."""
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if isinstance(config, Mapping):
        return {k: plain_config(v) for k, v in config.items()}
    return config


def model_config(config: Any, vocab_size: int) -> ModelConfig:
    """The validated ModelConfig (spec.model_spec: vocabulary padded to a multiple of 128 when model.vocab_size
    is 0, compute dtype from train.compute_dtype) with registry names checked and attention_impl="auto"
    resolved for this platform."""
    return resolve_names(model_spec(config, vocab_size))


def run_spec(config: Any, model_cfg: ModelConfig, num_devices: int, process_count: int,
             resolved: dict | None = None) -> RunSpec:
    """The RunSpec of `config` for this model, device count and process count: the train, mesh, logging and
    joint checks (ConfigError naming the setting)."""
    train = TrainSpec.from_config(config["train"])  # steps, batch, schedule, warm-up, clipping, nonfinite policy
    profiler.window(config)  # logging.profile_*
    wandb_run.check(config)  # logging.wandb*: the package installed, a valid mode
    resolved = resolved if resolved is not None else plain_config(config)
    return RunSpec(model=model_cfg, train=train, mesh=MeshSpec.from_config(config["mesh"], num_devices),
                   seq_len=config["data"]["seq_len"], config=resolved, process_count=process_count,
                   data=DataSpec.of(resolved["data"]))


def recorded_warmup(workdir: str) -> int | None:
    """The resolved warm-up (steps) of the run recorded in workdir/config.json; None when there is none."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return None
    train = read_run_json(path).get("train", {})
    if "warmup_steps" not in train or "steps" not in train:
        return None
    return warmup_steps(types.SimpleNamespace(warmup_steps=train["warmup_steps"], steps=train["steps"]))


def keep_recorded_warmup(config: Any, workdir: str) -> tuple[Any, int | None]:
    """(config, warm-up adopted or None). With train.warmup_steps=-1 (the default: it follows train.steps), a run
    on a workdir that already holds a run keeps that run's resolved warm-up, so a wsd run continued to more steps
    (run_io.check_workdir_config) is the same run up to its decay start without any setting; a resumed run
    resolves to what it recorded anyway. `config` is copied, never changed in place."""
    train = config["train"]  # a ConfigDict or a plain mapping
    if int(train["warmup_steps"]) != AUTO_WARMUP:
        return config, None
    warmup = recorded_warmup(workdir)
    if warmup is None or warmup == warmup_steps(types.SimpleNamespace(warmup_steps=AUTO_WARMUP,
                                                                        steps=train["steps"])):
        return config, None
    config = copy.deepcopy(config)
    config["train"]["warmup_steps"] = warmup
    return config, warmup


def check_plain(config: Any) -> None:
    """The checks that need nothing built or read (DataSpec, TrainSpec, the family's tasks): run first, so a
    mistake there is reported before a dataset is prepared or a tokenizer trained."""
    d = plain_config(config)
    data = DataSpec.of(d["data"])
    train = TrainSpec.from_config(d["train"])
    task = run_task(d["model"].get("family", "decoder"), d["train"].get("task", ""))
    if data.eval_set_list and task != "lm":
        raise ConfigError(f"data.eval_sets needs a next-token model (model.family='decoder', train.task='lm'); this "
                          f"run trains train.task={task!r}: leave data.eval_sets empty")
    if train.eval_tasks and task not in ("lm", "span_corruption"):
        raise ConfigError(f"train.eval_tasks scores continuations with a decoder (train.task='lm') or an encoder–"
                          f"decoder (train.task='span_corruption'); this run trains train.task={task!r}: leave "
                          "train.eval_tasks empty")
    eval_tasks.parse(train.eval_tasks)  # every task found (its documents are read when the run sets up)


def resolve(config: Any, num_devices: int, process_count: int, tokenizer: Any = None) -> Resolved:
    """Validates `config` (a ConfigDict or a plain nested mapping) for this many devices and processes
    (ConfigError naming the setting on a mistake). `tokenizer`: anything with `vocab_size`; default: the one
    `data.tokenizer` names."""
    check_plain(config)  # before any tokenizer is trained or file read
    resolved = plain_config(config)
    data_spec = DataSpec.of(resolved["data"])
    tokenizer = tokenizer if tokenizer is not None else get_tokenizer(data_spec)
    task_of = types.SimpleNamespace(train=TrainSpec.from_config(resolved["train"]), data=data_spec,
                                    model=types.SimpleNamespace(family=resolved["model"].get("family", "decoder")))
    model_cfg = model_config(resolved, model_vocab_size(task_of, tokenizer))
    resolved["model"]["vocab_size"] = model_cfg.vocab_size
    if getattr(tokenizer, "fingerprint", None):  # which tokenizer the run used (its copy is in the workdir)
        resolved["data"]["tokenizer_fingerprint"] = tokenizer.fingerprint
    data = resolve_data(data_spec, tokenizer) if resolvable(data_spec, tokenizer) else None
    if data is None:
        check_settings(data_spec)  # evaluation on training data is refused even in a dry run
    else:
        expected = resolved["data"].get(IDENTITY_KEY)  # a sweep's recorded data (or an earlier run's config.json)
        check_same("data.identity (the data this run must train on, e.g. its sweep's)", expected, data.identity())
        resolved["data"][IDENTITY_KEY] = data.identity()  # the documents and tokenizer, checked on resuming
    spec = run_spec(resolved, model_cfg, num_devices, process_count, resolved)
    return Resolved(model_cfg, spec.mesh.shape, resolved, spec, data)
