"""What the training loop reads and writes around the steps: the run's workdir check, the batch shapes,
signals, the progress line and summary.json. (Evaluation is evaluation.py; the guards, guards.py.)"""
from __future__ import annotations

import json
import math
import os
import types
from typing import Any

import jax

from transformer import environment, files
from transformer.data import identity, token_cache
from transformer.spec import ConfigError, ModelConfig, TrainSpec, padding_params, section_defaults
from transformer.spec import metric_keys
from transformer.training import hardware, optimizer, sharding


def write_json(path: str, obj: Any) -> None:
    files.write_json(path, obj, indent=2, sort_keys=True)


# How a run is launched and what it reports, not what it computes: these may change when a run resumes.
LAUNCH_SECTIONS = ("distributed", "logging")


# Settings a run may resume with changed: same updates, same checkpoint layout (a run out of memory resumes with
# a larger train.grad_accum_steps; train.max_skipped_fraction only judges the outcome); a run recorded before
# such a key existed is compared without it.
RESUMABLE_TRAIN_KEYS = ("grad_accum_steps", "max_skipped_fraction")


def read_run_json(path: str) -> Any:
    """A run's JSON file (config.json, summary.json) as written; a damaged one (cut short, not JSON) is one
    ConfigError naming the file and what to do, never a traceback."""
    try:
        with open(path) as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        workdir, name = os.path.split(path)
        fix = (f"each checkpoint holds a copy (e.g. {workdir}/checkpoints/STEP/config/metadata): copy the latest "
               f"over it to resume, or train in a new --workdir" if name == "config.json" else
               f"delete it (the run is then judged again from its checkpoints), or train in a new --workdir")
        raise ConfigError(f"{path} is damaged, not JSON ({e}); {fix}") from None


def check_workdir_writable(workdir: str) -> None:
    """ConfigError (naming the path) unless `workdir` can be written, or created: its nearest existing parent
    must be a writable directory. Checked before anything is built or written."""
    path = os.path.abspath(workdir)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    if not os.path.isdir(path):
        raise ConfigError(f"--workdir={workdir}: {path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        what = "the workdir" if path == os.path.abspath(workdir) else f"its parent {path}, where it would be created,"
        raise ConfigError(f"--workdir={workdir}: {what} is not writable (permission denied); choose a writable "
                          f"--workdir")
# Where the data is read from, not what it is: when both configs record a data identity (compared by content), a
# run resumes from a node-local copy of its corpus, a moved cache or tokenizer file.
DATA_LOCATION_KEYS = ("files", "eval_files", "data_dir", "cache_dir", "tokenizer")


def absent_as_default(recorded: dict, now: dict) -> dict:
    """`recorded` (an older config) with each key of the model, train and data sections that `now` has and it
    lacks set to its default (spec.section_defaults): a key added to the code later means, in a run recorded
    before, what its default means (docs/extending.md: a new option is added "default OFF")."""
    out = dict(recorded)
    for section, defaults in section_defaults().items():
        old, new = recorded.get(section), now.get(section)
        if isinstance(old, dict) and isinstance(new, dict):
            out[section] = {**{k: defaults[k] for k in new if k not in old and k in defaults}, **old}
    return out


# A wsd run continued to more steps on its workdir differs from the run it continues only in these.
CONTINUABLE_KEYS = ("train.steps", "train.eval_every", "train.checkpoint_every", "train.log_every")


def check_workdir_config(workdir: str, resolved: dict) -> int | None:
    """Refuses a workdir holding another run's config.json. Returns None, or the step to continue from when
    `resolved` continues the workdir's warm-up–stable–decay run to more steps (its stable phase extended): the
    old run's decay start, where the two runs are still one (optimizer.decay_start)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return None
    existing = read_run_json(path)
    identity.check_same(f"workdir {workdir}", existing.get("data", {}).get(identity.IDENTITY_KEY),
                        resolved.get("data", {}).get(identity.IDENTITY_KEY))  # names the files or the tokenizer
    same_content = bool(existing.get("data", {}).get(identity.IDENTITY_KEY)
                        and resolved.get("data", {}).get(identity.IDENTITY_KEY))  # compared by content just above
    hidden = (identity.IDENTITY_KEY, *(DATA_LOCATION_KEYS if same_content else ()))
    existing, resolved = ({k: ({**v, **{h: None for h in hidden}} if k == "data" else v) for k, v in d.items()
                           if k not in LAUNCH_SECTIONS} for d in (existing, resolved))
    existing = absent_as_default(existing, resolved)  # a key added since the run was recorded
    existing, resolved = _warmup_resolved(existing), _warmup_resolved(resolved)  # -1 and the count it gives agree
    existing, resolved = ({**d, "train": {k: v for k, v in d.get("train", {}).items() if k not in RESUMABLE_TRAIN_KEYS}}
                          for d in (existing, resolved))  # how an update is computed, not which: may change
    if existing == resolved:
        return None
    old, new = flatten_keys(existing), flatten_keys(resolved)
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if set(diff) <= set(CONTINUABLE_KEYS) and old.get("train.schedule") == "wsd" == new.get("train.schedule"):
        old_t, new_t = (TrainSpec.from_config(d["train"]) for d in (existing, resolved))
        if new_t.steps > old_t.steps and optimizer.warmup_steps(old_t) == optimizer.warmup_steps(new_t):
            return optimizer.decay_start(old_t)
        raise ConfigError(
            f"workdir {workdir} holds a wsd run of {old_t.steps} steps: it continues only to more steps with the "
            f"same warm-up ({optimizer.warmup_steps(old_t)} steps; train.warmup_steps=-1 keeps it), got "
            f"train.steps={new_t.steps} with a warm-up of {optimizer.warmup_steps(new_t)}")
    raise ConfigError(f"workdir {workdir} holds a different run's config (differs in {', '.join(diff[:8])}); "
                      f"use a new --workdir, or the same settings to resume"
                      + ("; a run continues to more steps only with train.schedule='wsd'"
                         if set(diff) <= set(CONTINUABLE_KEYS) else ""))


def _warmup_resolved(config: dict) -> dict:
    """`config` with train.warmup_steps as the count of steps it resolves to (-1: follows train.steps)."""
    train = config.get("train")
    if not isinstance(train, dict) or "warmup_steps" not in train or "steps" not in train:
        return config
    warmup = optimizer.warmup_steps(types.SimpleNamespace(warmup_steps=train["warmup_steps"], steps=train["steps"]))
    return {**config, "train": {**train, "warmup_steps": warmup}}


def flatten_keys(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_keys(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class Progress:
    """One line per logged step: step, loss (the losses of a group's runs), tokens/s, ETA."""

    def __init__(self, total_steps: int, enabled: bool):
        self.total, self.enabled = total_steps, enabled

    def __call__(self, step: int, losses: list[float | None], tps: float, seconds_per_step: float,
                 extra: str = "") -> None:
        if not self.enabled:
            return
        eta = (self.total - step) * seconds_per_step
        shown = (f"loss {losses[0]:7.4f}" if len(losses) == 1 else
                 "losses " + " ".join("failed" if x is None else f"{x:.4f}" for x in losses))
        print(f"step {step:>6}/{self.total} | {shown} | {tps:9,.0f} tok/s{' (group)' if len(losses) > 1 else ''} | "
              f"ETA {int(eta // 60):d}m{int(eta % 60):02d}s{extra}", flush=True)


def abstract_batch(task, spec: Any, batch_sharding) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes of a global batch (`spec`: the run's RunSpec), to compile the train step before any data is read."""
    return {k: jax.ShapeDtypeStruct(shape, d, sharding=batch_sharding)
            for k, (shape, d) in task.batch_spec(spec).items()}


def make_summary(*, status: str, error: str | None, step: int, steps: int, counts: dict, tokens_per_step: int,
                 fpt: float, last: dict, task_name: str, skipped: int | None, seconds: dict, tps: float | None,
                 num_devices: int, mesh_shape: Any, train_split_tokens: int | None = None,
                 split_tokens_per_step: int | None = None, model_cfg: ModelConfig | None = None,
                 vocab_size_unpadded: int | None = None, **extra: Any) -> dict:
    """summary.json: what a run reached and measured. `last`: its last train_loss/eval_loss/eval_accuracy/
    eval_bits_per_byte; `seconds`: wall/compile/train/eval seconds; `tps`: tokens/s of the timed steps (mfu
    follows); `epochs` = step · `split_tokens_per_step` (the split's tokens a step reads: a packed row of T
    targets is T + 1 tokens of the split, run_setup.split_tokens_per_step) / `train_split_tokens` (the training
    split's tokens; None when not packed text); `model_cfg` and `vocab_size_unpadded` (the ids a token can have,
    before padding to a multiple of 128): the model's vocabulary both ways and params_unpadded, N without the
    padding rows (spec/accounting.py)."""
    peak = hardware.peak_flops(jax.devices()[0])
    if model_cfg is not None and vocab_size_unpadded is not None:
        extra = {"vocab_size": model_cfg.vocab_size, "vocab_size_unpadded": int(vocab_size_unpadded),
                 "params_unpadded": counts["total"] - padding_params(model_cfg, vocab_size_unpadded), **extra}
    summary = {
        "status": status, "error": error, "step": step, "steps": steps,
        "params": counts["total"], "params_non_embedding": counts["non_embedding"],
        "params_trainable": counts.get("trainable", counts["total"]),
        "tokens": step * tokens_per_step, "flops": step * tokens_per_step * fpt, "flops_per_token": fpt,
        "eval_loss": last.get("eval_loss"), "eval_accuracy": last.get("eval_accuracy"),
        "eval_bits_per_byte": last.get("eval_bits_per_byte"), "train_split_tokens": train_split_tokens,
        "epochs": token_cache.epochs(step * split_tokens_per_step, train_split_tokens) if split_tokens_per_step
        else None,
        "train_loss": last.get("train_loss"), "task": task_name, "skipped_updates": skipped,
        **{f"{k}_seconds": v for k, v in seconds.items()}, "tokens_per_second": tps,
        "mfu": (tps * fpt / (peak["flops"] * num_devices)) if (tps and peak["flops"]) else None,
        "device": jax.devices()[0].device_kind, "num_devices": num_devices,
        "mesh": dict(zip(sharding.MESH_AXES, mesh_shape)), "environment": environment.record(),
        **metric_keys.summary_groups(last), **extra,
    }
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
