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
import numpy as np

from transformer import files
from transformer.config import ConfigError
from transformer.training import hardware, sharding


class Preempted(Exception):
    """Raised inside the loop when SIGTERM/SIGINT arrived; the loop checkpoints first."""


def write_json(path: str, obj: Any) -> None:
    files.write_json(path, obj, indent=2, sort_keys=True)


# How a run is launched and what it reports, not what it computes: these may change when a run resumes.
LAUNCH_SECTIONS = ("distributed", "logging")


def check_workdir_config(workdir: str, resolved: dict) -> None:
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        existing = json.load(f)
    existing, resolved = ({k: v for k, v in d.items() if k not in LAUNCH_SECTIONS} for d in (existing, resolved))
    if existing != resolved:
        diff = sorted(k for k in set(flatten_keys(existing)) | set(flatten_keys(resolved))
                      if flatten_keys(existing).get(k) != flatten_keys(resolved).get(k))
        raise ConfigError(f"workdir {workdir} holds a different run's config (differs in {', '.join(diff[:8])}); "
                          f"use a new --workdir, or the same settings to resume")


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


def global_batch(local: dict[str, np.ndarray], batch_sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
    """Host-local rows (this process's shard) → one global array per key."""
    return {k: jax.make_array_from_process_local_data(batch_sharding, v) for k, v in local.items()}


def abstract_batch(task, config: Any, batch_sharding) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes of a global batch, to compile the train step before any data is read."""
    return {k: jax.ShapeDtypeStruct(shape, d, sharding=batch_sharding)
            for k, (shape, d) in task.batch_spec(config).items()}


def evaluate(eval_fn: Callable, params: Any, task, config: Any, batch_sharding, process_index: int,
             process_count: int) -> dict[str, float]:
    """Token-mean loss and accuracy over the first `train.eval_steps` batches of the eval split, shuffled
    with a fixed seed so they sample the whole split (and are the same batches at every evaluation)."""
    it = task.make_iterator(config, split=config.data.eval_split, global_batch_size=config.train.batch_size,
                            seed=config.data.shuffle_seed, process_index=process_index,
                            process_count=process_count, shuffle=True, repeat=True)
    sums = {"loss_sum": 0.0, "weight_sum": 0.0, "correct_sum": 0.0}
    for _ in range(config.train.eval_steps):
        out = jax.device_get(eval_fn(params, global_batch(next(it), batch_sharding)))
        for k in sums:
            sums[k] = sums[k] + np.asarray(out[k], np.float64)
    n = np.maximum(sums["weight_sum"], 1.0)
    # floats; lists of R floats when eval_fn is a group's vmapped eval step (sums of shape (R,))
    return {"eval_loss": (sums["loss_sum"] / n).tolist(), "eval_accuracy": (sums["correct_sum"] / n).tolist()}


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
                 num_devices: int, mesh_shape: Any, **extra: Any) -> dict:
    """summary.json: what a run reached and measured. `last`: its last train_loss/eval_loss/eval_accuracy;
    `seconds`: wall/compile/train/eval seconds; `tps`: tokens/s of the timed steps (mfu follows)."""
    peak = hardware.peak_flops(jax.devices()[0])
    summary = {
        "status": status, "error": error, "step": step, "steps": steps,
        "params": counts["total"], "params_non_embedding": counts["non_embedding"],
        "tokens": step * tokens_per_step, "flops": step * tokens_per_step * fpt, "flops_per_token": fpt,
        "eval_loss": last.get("eval_loss"), "eval_accuracy": last.get("eval_accuracy"),
        "train_loss": last.get("train_loss"), "task": task_name, "skipped_updates": skipped,
        **{f"{k}_seconds": v for k, v in seconds.items()}, "tokens_per_second": tps,
        "mfu": (tps * fpt / (peak["flops"] * num_devices)) if (tps and peak["flops"]) else None,
        "device": jax.devices()[0].device_kind, "num_devices": num_devices,
        "mesh": dict(zip(sharding.MESH_AXES, mesh_shape)), **extra,
    }
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in summary.items()}
