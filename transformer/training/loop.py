"""The training loop: config → data → sharded state → jitted steps → metrics, checkpoints, summary.

`train(config, workdir)` is the whole Train contract (docs/design.md): rerunning it on the same workdir
resumes from the latest checkpoint (model, optimizer, data position; the dropout RNG is derived from
(seed, step)) and ends with the same result as an uninterrupted run.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils

from transformer import files
from transformer.data import get_tokenizer, record_tokenizer
from transformer.models import build_model
from transformer.models.config import ConfigError
from transformer.scaling.accounting import flops_per_token, param_counts
from transformer.tasks import get_task
from transformer.training import checkpointing, hardware, nonfinite, sharding, steps
from transformer.training.metrics import MetricsWriter, read_metrics
from transformer.training.optimizer import make_optimizer, make_schedule
from transformer.training.resolve import resolve
from transformer.training.state import abstract_state, init_state
from transformer.training.warm_start import warm_start


class Preempted(Exception):
    """Raised inside the loop when SIGTERM/SIGINT arrived; the loop checkpoints first."""


def write_json(path: str, obj: Any) -> None:
    files.write_json(path, obj, indent=2, sort_keys=True)


LAUNCH_SECTIONS = ("distributed",)  # how a run is launched, not what it computes: may change on resume


def check_workdir_config(workdir: str, resolved: dict) -> None:
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        existing = json.load(f)
    existing, resolved = ({k: v for k, v in d.items() if k not in LAUNCH_SECTIONS} for d in (existing, resolved))
    if existing != resolved:
        diff = sorted(k for k in set(_flatten(existing)) | set(_flatten(resolved))
                      if _flatten(existing).get(k) != _flatten(resolved).get(k))
        raise ConfigError(f"workdir {workdir} holds a different run's config (differs in {', '.join(diff[:8])}); "
                          f"use a new --workdir, or the same settings to resume")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class _Progress:
    """One line per logged step: step, loss, tokens/s, ETA."""

    def __init__(self, total_steps: int, enabled: bool):
        self.total, self.enabled = total_steps, enabled

    def __call__(self, step: int, loss: float, tps: float, seconds_per_step: float, extra: str = "") -> None:
        if not self.enabled:
            return
        eta = (self.total - step) * seconds_per_step
        print(f"step {step:>6}/{self.total} | loss {loss:7.4f} | {tps:9,.0f} tok/s | "
              f"ETA {int(eta // 60):d}m{int(eta % 60):02d}s{extra}", flush=True)


def _global_batch(local: dict[str, np.ndarray], batch_sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
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
        out = jax.device_get(eval_fn(params, _global_batch(next(it), batch_sharding)))
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


def train(config: Any, workdir: str, *, verbose: bool = True, stop_at: int | None = None) -> dict:
    """Runs (or resumes) training in `workdir`; returns the summary also written to summary.json.

    `stop_at`: behave as if preempted right after this step (checkpoint, status "preempted").
    """
    t_start = time.time()
    pid, nproc = jax.process_index(), jax.process_count()
    primary = pid == 0
    tokenizer = get_tokenizer(config.data, workdir=workdir)  # the run's recorded copy when resuming
    run = resolve(config, jax.device_count(), nproc, tokenizer)
    model_cfg, mesh_shape, resolved = run.model_cfg, run.mesh_shape, run.config
    os.makedirs(workdir, exist_ok=True)
    check_workdir_config(workdir, json.loads(json.dumps(resolved)))
    summary_path = os.path.join(workdir, "summary.json")
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            previous_summary = json.load(f)
        if previous_summary.get("status") == "ok":
            if verbose and primary:
                print(f"{workdir} already finished (status ok); nothing to do", flush=True)
            return previous_summary

    t = config.train
    task = get_task(config)
    model = build_model(model_cfg)
    tx = make_optimizer(t)
    schedule = make_schedule(t)
    mesh = sharding.make_mesh(config.mesh)
    rules = sharding.rules(config.mesh)
    counts = param_counts(model_cfg)
    fpt = flops_per_token(model_cfg, config.data.seq_len)["with_attention"]
    tokens_per_step = t.batch_size * config.data.seq_len

    train_data = dict(split=config.data.train_split, global_batch_size=t.batch_size,
                      seed=config.data.shuffle_seed + t.seed, process_index=pid, process_count=nproc,
                      shuffle=True, repeat=True)
    data_it = task.make_iterator(config, **train_data)
    if primary:  # only once the data is found: a mistyped dataset leaves no half-made run behind
        record_tokenizer(tokenizer, workdir)  # sampling and resuming need nothing outside the workdir
        write_json(os.path.join(workdir, "config.json"), resolved)
    ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"), keep=t.keep_checkpoints)
    abstract, shardings = abstract_state(model, tx, task.init_inputs(config), mesh, rules)
    def fresh_state(announce: bool = False):
        """Step 0: initialised from the seed, then warm-started from train.init_from when set."""
        state, _ = init_state(model, tx, t.seed, task.init_inputs(config), mesh, rules)
        if t.get("init_from"):
            state, copied = warm_start(state, t.init_from)
            if announce and verbose and primary:
                print(f"warm start from {t.init_from}: {len(copied['copied'])} parameters copied, "
                      f"{len(copied['kept'])} freshly initialised ({', '.join(copied['kept'][:4])}"
                      f"{', ...' if len(copied['kept']) > 4 else ''})", flush=True)
        return state

    restored = ckpt.restore(abstract, data_it)
    if restored is None:
        state, start_step = fresh_state(announce=True), 0
    else:
        start_step, state = restored
        if not ckpt.data_position_restored:  # written by another number of processes
            train_data["seed"] += start_step  # new shards: do not replay their first batches
            data_it = task.make_iterator(config, **train_data)
            if primary:
                print(f"warning: checkpoint {start_step} was written by another number of processes; model and "
                      f"optimizer restored, the data iterator starts over on the new shards (seed + {start_step})",
                      flush=True)
    if verbose and primary:
        print(f"{model_cfg.family} model: {counts['total']:,} params ({counts['non_embedding']:,} non-embedding), "
              f"{fpt / 1e6:.2f} MFLOP/token; mesh {dict(zip(sharding.MESH_AXES, mesh_shape))}; "
              f"{'resuming from step ' + str(start_step) if start_step else 'starting'} in {workdir}", flush=True)
    writer = MetricsWriter(workdir, enabled=primary, resume_step=start_step)
    history = read_metrics(workdir) if primary and start_step else []  # rows up to the checkpoint

    batch_s = sharding.batch_sharding(mesh, rules)
    train_step = steps.make_train_step(model, task, tx, seed=t.seed, use_dropout=model_cfg.dropout_rate > 0,
                                       loss_chunk_size=t.get("loss_chunk_size", 0))
    train_fn, eval_fn = steps.jit_steps(train_step, steps.make_eval_step(model, task), shardings, mesh, rules)

    def diagnose(bad_step: int, bad_loss: float) -> str:
        """Replays from the newest checkpoint (all are older than bad_step) to the state before it and
        recomputes that batch's gradients, to name the first non-finite one."""
        try:
            ckpt.wait()
            it = task.make_iterator(config, **train_data)
            found = ckpt.restore(abstract, it)
            from_step, st = found if found is not None else (0, fresh_state())
            for _ in range(from_step, bad_step - 1):
                st, _ = train_fn(st, _global_batch(next(it), batch_s))
            grad_fn = nonfinite.make_grad_fn(model, task, seed=t.seed, use_dropout=model_cfg.dropout_rate > 0,
                                               loss_chunk_size=t.get("loss_chunk_size", 0))
            _, grads = grad_fn(st.params, _global_batch(next(it), batch_s), st.step)
            return nonfinite.describe(bad_step, bad_loss, nonfinite.nonfinite_leaves(grads),
                                      from_step if found is not None else None)
        except Exception as e:  # noqa: BLE001 - the diagnosis must not hide the fault itself
            return nonfinite.describe(bad_step, bad_loss, None, None) + f" ({type(e).__name__}: {e})"

    signals = contextlib.ExitStack()  # the handlers come back in the `finally` below
    stop = signals.enter_context(preemption_signals())

    def should_stop(sync_point: bool) -> bool:
        """Preempted? Every process must agree on the step: with several, the flags are gathered at
        sync points (every log_every steps), so the one that got the signal and the others stop together."""
        if stop_at is not None and step >= stop_at:
            return True
        if nproc == 1:
            return stop["signal"] is not None
        if not sync_point:
            return False
        flags = multihost_utils.process_allgather(np.array([stop["signal"] is not None], np.int32))
        if np.any(flags) and stop["signal"] is None:
            stop["signal"] = "another process's"
        return bool(np.any(flags))

    progress = _Progress(t.steps, verbose and primary)
    status, error, eval_loss, eval_accuracy, train_loss = "ok", None, None, None, None
    for r in history:  # a run resumed at (or preempted right after) a checkpoint reports its last values
        train_loss = r.get("train_loss", train_loss)
        eval_loss, eval_accuracy = r.get("eval_loss", eval_loss), r.get("eval_accuracy", eval_accuracy)
    spikes = nonfinite.SpikeDetector([r.get("train_loss") for r in history])
    window: list[tuple[int, dict]] = []  # this window's per-step (loss, finite), fetched at the next sync
    skipped = nonfinite.skipped_updates(state.opt_state)
    compile_seconds, timed_tokens, timed_seconds = 0.0, 0, 0.0
    eval_seconds = 0.0  # evaluation, its first-call compilation included
    step = start_step
    # XLA:CPU runs simulated devices on one shared thread pool: with two multi-device steps in flight,
    # a collective's rendezvous can starve past XLA's 40 s limit and abort the process. On CPU each step
    # therefore completes before the next is dispatched (nothing is lost: there is no device queue to fill).
    serialize_steps = jax.devices()[0].platform == "cpu" and jax.local_device_count() > 1
    last_saved = start_step
    try:
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
            t_compile = time.time()
            train_fn = train_fn.lower(state, abstract_batch(task, config, batch_s)).compile()
            compile_seconds = time.time() - t_compile
            window_start, window_steps = time.time(), 0
            while step < t.steps:
                if should_stop(sync_point=step == start_step or step % t.log_every == 0):
                    raise Preempted()
                batch = _global_batch(next(data_it), batch_s)  # host work overlaps the previous step
                state, m = train_fn(state, batch)               # dispatched asynchronously
                if serialize_steps:
                    jax.block_until_ready(m)
                step += 1
                window_steps += 1
                window.append((step, {"loss": m["loss"], "finite": m["finite"]}))  # device scalars: no sync
                is_log = step % t.log_every == 0 or step == t.steps
                is_eval = step % t.eval_every == 0 or step == t.steps
                is_ckpt = step % t.checkpoint_every == 0 or step == t.steps
                if is_log or is_eval or is_ckpt:  # a host sync: check every step since the last one
                    fetched, window = jax.device_get(window), []
                    bad = nonfinite.first_bad(fetched)
                    if bad is not None and t.nonfinite == "stop":  # before any checkpoint of the bad state
                        raise nonfinite.NonFiniteError(diagnose(*bad))
                    if bad is not None and primary:
                        n_bad = sum(1 for _, x in fetched if not bool(x["finite"]))
                        print(f"warning: non-finite loss or gradient at step {bad[0]}"
                              f"{f' and {n_bad - 1} more steps up to {step}' if n_bad > 1 else ''}; "
                              f"update skipped (train.nonfinite='skip')", flush=True)
                if is_log or is_eval:
                    m = jax.device_get(m)
                    train_loss = float(m["loss"])
                    elapsed = time.time() - window_start
                    timed_tokens += window_steps * tokens_per_step
                    timed_seconds += elapsed
                    tps = window_steps * tokens_per_step / max(elapsed, 1e-9)
                    row = {"train_loss": train_loss, "learning_rate": float(schedule(step - 1)),
                           "grad_norm": float(m["grad_norm"]), "tokens": step * tokens_per_step,
                           "flops": step * tokens_per_step * fpt, "tokens_per_second": tps}
                    extra = ""
                    if skipped is not None:
                        skipped = nonfinite.skipped_updates(state.opt_state)
                        row["skipped_updates"] = skipped
                    spike = spikes.check(fetched, train_loss)
                    if spike is not None:
                        row["loss_spike"] = spike[1]
                        extra += f" | loss spike x{spike[1]:.1f} at step {spike[0]}"
                        if primary:
                            print(f"warning: {workdir}: loss spike at step {spike[0]}: {spike[1]:.2f}x the median "
                                  f"of the last {len(spikes.history) - 1} logged losses; its batch is number "
                                  f"{spike[0] - 1} of split {config.data.train_split!r} shuffled with seed "
                                  f"{train_data['seed']} (runs with the same seed saw the same batch)", flush=True)
                    if is_eval:
                        t_eval = time.time()
                        row.update(evaluate(eval_fn, state.params, task, config, batch_s, pid, nproc))
                        eval_seconds += time.time() - t_eval
                        eval_loss, eval_accuracy = row["eval_loss"], row["eval_accuracy"]
                        extra += f" | eval {eval_loss:.4f}"
                    writer.write(step, row)
                    progress(step, train_loss, tps, elapsed / window_steps, extra)
                    window_start, window_steps = time.time(), 0
                if is_ckpt:
                    ckpt.save(step, state, data_it, resolved, force=True)  # data_it has yielded `step` batches
                    last_saved = step
            if eval_loss is None and step == t.steps:  # resumed at the last step with its row lost
                final = evaluate(eval_fn, state.params, task, config, batch_s, pid, nproc)
                eval_loss, eval_accuracy = final["eval_loss"], final["eval_accuracy"]
    except Preempted:
        status = "preempted"
        bad = nonfinite.first_bad(jax.device_get(window))  # steps since the last sync: never save a NaN state
        if bad is not None and t.nonfinite == "stop":
            status, error = "failed", nonfinite.describe(*bad, None, None)
        elif last_saved != step:
            ckpt.save(step, state, data_it, resolved, force=True)
        if primary:
            why = f"received signal {stop['signal']}" if stop["signal"] is not None else f"stop_at={stop_at}"
            print(f"{why}: checkpointed step {step}, exiting" if status == "preempted" else f"{why}: {error}",
                  flush=True)
    except Exception as e:
        status, error = "failed", f"{type(e).__name__}: {e}"
        raise
    finally:
        signals.close()
        ckpt.close()
        writer.close()
        summary = make_summary(
            status=status, error=error, step=step, steps=t.steps, counts=counts, tokens_per_step=tokens_per_step,
            fpt=fpt, last=dict(eval_loss=eval_loss, eval_accuracy=eval_accuracy, train_loss=train_loss),
            task_name=task.name, skipped=skipped,
            seconds=dict(wall=time.time() - t_start, compile=compile_seconds, train=timed_seconds, eval=eval_seconds),
            tps=timed_tokens / timed_seconds if timed_seconds else None, num_devices=jax.device_count(),
            mesh_shape=mesh_shape)
        if primary:
            write_json(summary_path, summary)
        if nproc > 1:
            multihost_utils.sync_global_devices("train_done")
    if verbose and primary and status == "ok":
        print(f"done: eval_loss {eval_loss:.4f}, {summary['wall_seconds']:.0f}s wall, "
              f"{(summary['tokens_per_second'] or 0):,.0f} tok/s", flush=True)
    return summary
