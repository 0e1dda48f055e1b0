"""What the training loop reads and writes around the steps: the run's workdir check, batches as global
arrays, evaluation, signals, the progress line and summary.json."""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from transformer import files
from transformer.spec import ConfigError, ModelConfig, padding_params
from transformer.data import identity, token_cache
from transformer.training import hardware, optimizer, sharding


class Preempted(Exception):
    """Raised inside the loop when SIGTERM/SIGINT arrived; the loop checkpoints first."""


def write_json(path: str, obj: Any) -> None:
    files.write_json(path, obj, indent=2, sort_keys=True)


# How a run is launched and what it reports, not what it computes: these may change when a run resumes.
LAUNCH_SECTIONS = ("distributed", "logging")


# A wsd run continued to more steps on its workdir differs from the run it continues only in these.
CONTINUABLE_KEYS = ("train.steps", "train.eval_every", "train.checkpoint_every", "train.log_every")


def check_workdir_config(workdir: str, resolved: dict) -> int | None:
    """Refuses a workdir holding another run's config.json. Returns None, or the step to continue from when
    `resolved` continues the workdir's warm-up–stable–decay run to more steps (its stable phase extended): the
    old run's decay start, where the two runs are still one (optimizer.decay_start)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        existing = json.load(f)
    identity.check_same(f"workdir {workdir}", existing.get("data", {}).get(identity.IDENTITY_KEY),
                        resolved.get("data", {}).get(identity.IDENTITY_KEY))  # names the files or the tokenizer
    existing, resolved = ({k: ({**v, identity.IDENTITY_KEY: None} if k == "data" else v) for k, v in d.items()
                           if k not in LAUNCH_SECTIONS} for d in (existing, resolved))  # compared just above
    if existing == resolved:
        return None
    old, new = flatten_keys(existing), flatten_keys(resolved)
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if set(diff) <= set(CONTINUABLE_KEYS) and old.get("train.schedule") == "wsd" == new.get("train.schedule"):
        old_t, new_t = (ml_collections.ConfigDict(d["train"]) for d in (existing, resolved))
        if new_t.steps > old_t.steps and optimizer.warmup_steps(old_t) == optimizer.warmup_steps(new_t):
            return optimizer.decay_start(old_t)
        raise ConfigError(
            f"workdir {workdir} holds a wsd run of {old_t.steps} steps: it continues only to more steps with the "
            f"same warm-up ({optimizer.warmup_steps(old_t)} steps; with train.warmup_steps=-1 the warm-up follows "
            f"train.steps, so set it explicitly), got train.steps={new_t.steps} with a warm-up of "
            f"{optimizer.warmup_steps(new_t)}")
    raise ConfigError(f"workdir {workdir} holds a different run's config (differs in {', '.join(diff[:8])}); "
                      f"use a new --workdir, or the same settings to resume"
                      + ("; a run continues to more steps only with train.schedule='wsd'"
                         if set(diff) <= set(CONTINUABLE_KEYS) else ""))


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


def global_batch(local: dict[str, np.ndarray], batch_sharding: jax.sharding.Sharding,
                 global_rows: int | None = None) -> dict[str, jax.Array]:
    """Host-local rows (this process's rows, data.batches.process_rows) → one global array per key of
    `global_rows` rows (needed when processes hold replicas of the same rows; None: inferred)."""
    return {k: jax.make_array_from_process_local_data(
        batch_sharding, v, None if global_rows is None else (global_rows, *v.shape[1:])) for k, v in local.items()}


def abstract_batch(task, config: Any, batch_sharding) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes of a global batch, to compile the train step before any data is read."""
    return {k: jax.ShapeDtypeStruct(shape, d, sharding=batch_sharding)
            for k, (shape, d) in task.batch_spec(config).items()}


def evaluate(eval_fn: Callable, params: Any, task, config: Any, batch_sharding, process_index: int,
             process_count: int, token_bytes_V: np.ndarray | None = None, data: Any = None,
             rows: Any = None) -> dict[str, Any]:
    """Token-mean loss and accuracy over the first `train.eval_steps` batches of the eval split, shuffled
    with a fixed seed so they sample the whole split (and are the same batches at every evaluation).

    `token_bytes_V` (the tokenizer's byte_lengths, for next-token prediction): also `eval_bits_per_byte`,
    the summed loss in bits over the UTF-8 bytes of the very targets it was taken on (each weighted
    target's byte length, summed over every process's rows), comparable across tokenizers. `data`: the run's
    resolved data (identity.RunData), so the iterator re-derives nothing; `rows`: this process's rows of a
    global batch (data.batches.process_rows), default by process index.
    """
    it = task.make_iterator(config, split=config.data.eval_split, global_batch_size=config.train.batch_size,
                            seed=config.data.shuffle_seed, process_index=process_index,
                            process_count=process_count, shuffle=True, repeat=True, data=data, rows=rows)
    sums = {"loss_sum": 0.0, "weight_sum": 0.0, "correct_sum": 0.0}
    target_bytes = 0.0  # this process's rows
    try:
        for _ in range(config.train.eval_steps):
            local = next(it)
            if token_bytes_V is not None:
                target_bytes += float(np.sum(token_bytes_V[local["targets"]] * local["weights"], dtype=np.float64))
            out = jax.device_get(eval_fn(params, global_batch(local, batch_sharding, config.train.batch_size)))
            for k in sums:
                sums[k] = sums[k] + np.asarray(out[k], np.float64)
    finally:
        if hasattr(it, "close"):  # its reader threads (or worker processes) end now
            it.close()
    n = np.maximum(sums["weight_sum"], 1.0)
    # floats; lists of R floats when eval_fn is a group's vmapped eval step (sums of shape (R,))
    result = {"eval_loss": (sums["loss_sum"] / n).tolist(), "eval_accuracy": (sums["correct_sum"] / n).tolist()}
    if token_bytes_V is not None:
        if process_count > 1:
            from jax.experimental import multihost_utils
            target_bytes = float(np.sum(multihost_utils.process_allgather(np.array([target_bytes]))))
        result["eval_bits_per_byte"] = (sums["loss_sum"] / (math.log(2) * max(target_bytes, 1.0))).tolist()
    return result


@contextlib.contextmanager
def preemption_signals():
    """Within the block, SIGTERM/SIGINT only set flag["signal"] (the loop checkpoints, then stops);
    the previous handlers come back on leaving it."""
    flag = {"signal": None}
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, lambda signum, _frame: flag.update(signal=signum))
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def make_summary(*, status: str, error: str | None, step: int, steps: int, counts: dict, tokens_per_step: int,
                 fpt: float, last: dict, task_name: str, skipped: int | None, seconds: dict, tps: float | None,
                 num_devices: int, mesh_shape: Any, train_split_tokens: int | None = None,
                 model_cfg: ModelConfig | None = None, vocab_size_unpadded: int | None = None, **extra: Any) -> dict:
    """summary.json: what a run reached and measured. `last`: its last train_loss/eval_loss/eval_accuracy/
    eval_bits_per_byte; `seconds`: wall/compile/train/eval seconds; `tps`: tokens/s of the timed steps (mfu
    follows); `train_split_tokens`: tokens of the training split (None when not packed text), for `epochs`;
    `model_cfg` and `vocab_size_unpadded` (the ids a token can have, before padding to a multiple of 128): the
    model's vocabulary both ways and params_unpadded, N without the padding rows (spec/accounting.py)."""
    peak = hardware.peak_flops(jax.devices()[0])
    if model_cfg is not None and vocab_size_unpadded is not None:
        extra = {"vocab_size": model_cfg.vocab_size, "vocab_size_unpadded": int(vocab_size_unpadded),
                 "params_unpadded": counts["total"] - padding_params(model_cfg, vocab_size_unpadded), **extra}
    summary = {
        "status": status, "error": error, "step": step, "steps": steps,
        "params": counts["total"], "params_non_embedding": counts["non_embedding"],
        "tokens": step * tokens_per_step, "flops": step * tokens_per_step * fpt, "flops_per_token": fpt,
        "eval_loss": last.get("eval_loss"), "eval_accuracy": last.get("eval_accuracy"),
        "eval_bits_per_byte": last.get("eval_bits_per_byte"), "train_split_tokens": train_split_tokens,
        "epochs": token_cache.epochs(step * tokens_per_step, train_split_tokens),
        "train_loss": last.get("train_loss"), "task": task_name, "skipped_updates": skipped,
        **{f"{k}_seconds": v for k, v in seconds.items()}, "tokens_per_second": tps,
        "mfu": (tps * fpt / (peak["flops"] * num_devices)) if (tps and peak["flops"]) else None,
        "device": jax.devices()[0].device_kind, "num_devices": num_devices,
        "mesh": dict(zip(sharding.MESH_AXES, mesh_shape)), **extra,
    }
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
