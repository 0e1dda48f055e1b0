"""Several same-shape runs trained as one program (`sweep.multirun`): the group's training loop.

Legend: R runs in the group.

The runs of a group differ only in train.learning_rate and train.seed (an LR scan, repeats over seeds;
`group_key` decides). One vmapped train step (multirun.py) trains all R, each from its own seed on its
own data stream. Each run still gets, in its own workdir, everything `loop.train` writes: config.json,
metrics.jsonl, checkpoints in train()'s format (the optimizer state holds no learning rate, so a run
checkpointed in a group resumes alone under train(), and the other way round) and summary.json. The
sweep therefore records, resumes and retries grouped runs as it does the others. The runs share the
eval split's batches, so one vmapped eval step (multirun.make_multi_eval_step) evaluates all R at once;
train()'s summary and signal handling are loop.make_summary and loop.preemption_signals.

What differs from train(): the group trains on one device (the first) in one process; under
train.nonfinite="stop" a run whose loss turns non-finite is failed (without train()'s replay diagnosis)
while the rest go on. Times and rates
are accounted so that sums over a sweep's rows stay right: each run's wall/compile/train/eval seconds
are its share (the group's / R), and tokens_per_second (in metrics.jsonl too) and mfu are the group's,
so that tokens = tokens_per_second × train_seconds still holds per run.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer.data import get_tokenizer, record_tokenizer
from transformer.models import build_model
from transformer.models.config import ConfigError
from transformer.scaling.accounting import flops_per_token, param_counts
from transformer.tasks import get_task, model_vocab_size
from transformer.training import checkpointing, multirun, nonfinite, sharding, validate
from transformer.training.loop import (Preempted, abstract_batch, check_workdir_config, evaluate, make_summary,
                                       preemption_signals, write_json)
from transformer.training.metrics import MetricsWriter, read_metrics
from transformer.training.optimizer import make_optimizer, make_schedule
from transformer.training.state import TrainState, abstract_state

FREE_KEYS = ("learning_rate", "seed")  # the train.* settings in which a group's runs may differ
LAST_KEYS = ("train_loss", "eval_loss", "eval_accuracy")  # a run's last logged values go to its summary


def group_key(config: Any) -> str | None:
    """Runs with the same key can train as one group; None: this run trains alone (dropout masks
    follow the step's one seed; warm starts are per run)."""
    c = json.loads(json.dumps(config.to_dict()))
    if c["model"].get("dropout_rate", 0) or c["train"].get("init_from"):
        return None
    c["train"] = {k: v for k, v in c["train"].items() if k not in FREE_KEYS}
    return json.dumps(c, sort_keys=True)


class GroupMismatch(RuntimeError):
    """The runs' checkpoints are at different steps: they cannot continue as one group."""


def _run_state(states: TrainState, r: int) -> TrainState:
    """Run r's slice in train()'s layout: the optimizer state without the per-run learning-rate stage."""
    inner, _ = states.opt_state
    return TrainState(step=states.step[r], params=multirun.unstack(states.params, r),
                      opt_state=multirun.unstack(inner, r))


def _skipped_updates(states: TrainState) -> list[int] | None:
    """Per run, the updates optax.apply_if_finite dropped (train.nonfinite="skip"), or None."""
    inner, _ = states.opt_state
    if not isinstance(inner, optax.ApplyIfFiniteState):
        return None
    return [int(n) for n in jax.device_get(inner.total_notfinite)]


def _stack(run_states: Sequence[TrainState], learning_rates: Sequence[float]) -> TrainState:
    """train()-layout states (one per run) → the group's state with the per-run learning-rate stage."""
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *run_states)
    return stacked.replace(opt_state=(stacked.opt_state, multirun.RunLR(jnp.asarray(learning_rates, jnp.float32))))


def compile_step(step: Any, states: TrainState, batch_spec: dict) -> Any:
    """The group's train step compiled for the runs in `states` (their number is its leading axis)."""
    return step.lower(states, batch_spec).compile()


def train_group(configs: Sequence[Any], workdirs: Sequence[str], *, verbose: bool = True,
                stop_at: int | None = None) -> list[dict]:
    """Trains (or resumes) R runs together; returns their summaries (also written to each summary.json).

    Raises GroupMismatch, before any training, when the runs' checkpoints are at different steps.
    `stop_at`: behave as if preempted right after this step.
    """
    t_start = time.time()
    R = len(configs)
    if jax.process_count() != 1:
        raise ConfigError(f"sweep.multirun trains a group in one process, but this job has {jax.process_count()} "
                          f"processes; set sweep.multirun=False")
    if len({group_key(c) for c in configs} | {None}) != 2:
        raise ValueError(f"a group's runs may differ only in train.{' and train.'.join(FREE_KEYS)} (no dropout, "
                         "no train.init_from)")
    config, t = configs[0], configs[0].train
    tokenizer = get_tokenizer(config.data)
    model_cfg = validate.model_config(config, model_vocab_size(config, tokenizer))
    mesh_shape = validate.check_training(config, model_cfg, 1, 1)
    resolved = []
    for c, workdir in zip(configs, workdirs):
        d = c.to_dict()
        d["model"]["vocab_size"] = model_cfg.vocab_size
        d["data"]["tokenizer_fingerprint"] = tokenizer.fingerprint
        os.makedirs(workdir, exist_ok=True)
        check_workdir_config(workdir, json.loads(json.dumps(d)))
        resolved.append(d)
    lrs = [float(c.train.learning_rate) for c in configs]
    schedules = [make_schedule(c.train) for c in configs]
    task, model = get_task(config), build_model(model_cfg)
    tx = multirun.make_optimizer(t)
    mesh, rules = sharding.make_mesh(config.mesh, jax.devices()[:1]), sharding.rules(config.mesh)
    batch_s = sharding.batch_sharding(mesh, rules)
    counts = param_counts(model_cfg)
    fpt = flops_per_token(model_cfg, config.data.seq_len)["with_attention"]
    tokens_per_step = t.batch_size * config.data.seq_len  # per run

    data_its = [task.make_iterator(c, split=c.data.train_split, global_batch_size=t.batch_size,
                                   seed=c.data.shuffle_seed + c.train.seed, process_index=0, process_count=1,
                                   shuffle=True, repeat=True) for c in configs]
    for workdir, d in zip(workdirs, resolved):
        record_tokenizer(tokenizer, workdir)
        write_json(os.path.join(workdir, "config.json"), d)
    ckpts = [checkpointing.Checkpointer(os.path.join(w, "checkpoints"), keep=t.keep_checkpoints) for w in workdirs]
    writers: list[MetricsWriter] = []
    try:
        abstract, _ = abstract_state(model, make_optimizer(t), task.init_inputs(config), mesh, rules)
        restored = [ck.restore(abstract, it) for ck, it in zip(ckpts, data_its)]
        at = sorted({r[0] if r else 0 for r in restored})
        if len(at) > 1:
            raise GroupMismatch(f"the runs' checkpoints are at steps {at}; they continue one by one")
        start_step = at[0]
        states = (multirun.init_states(model, tx, seeds=[c.train.seed for c in configs], learning_rates=lrs,
                                       init_inputs=task.init_inputs(config)) if start_step == 0
                  else _stack([r[1] for r in restored], lrs))
        states = jax.device_put(states, jax.devices()[0])
        writers = [MetricsWriter(w, resume_step=start_step) for w in workdirs]
        histories = [read_metrics(w) if start_step else [] for w in workdirs]
        if verbose:
            print(f"group of {R} runs ({model_cfg.family}, {counts['total']:,} params, learning rates "
                  f"{', '.join(f'{lr:.3g}' for lr in lrs)}): "
                  f"{'resuming from step ' + str(start_step) if start_step else 'starting'}", flush=True)
        last = [{} for _ in range(R)]  # train_loss, eval_loss, eval_accuracy: a resumed run's last logged values
        for r, history in enumerate(histories):
            for row in history:
                last[r].update({k: row[k] for k in LAST_KEYS if k in row})
        spikes = [nonfinite.SpikeDetector([row.get("train_loss") for row in h]) for h in histories]
        status, errors = ["ok"] * R, [None] * R
        train_step = multirun.make_multi_train_step(model, task, tx, seed=t.seed, use_dropout=False,
                                                    loss_chunk_size=t.get("loss_chunk_size", 0))
        multi_eval = multirun.make_multi_eval_step(model, task)  # one pass over the shared eval batches

        def eval_fn(params_R: Any, batch: dict) -> dict:
            return multi_eval(params_R, multirun.stack_batch(batch, len(live)))

        spec = abstract_batch(task, configs[0], None)

        def stacked_spec(runs: int) -> dict:
            return {k: jax.ShapeDtypeStruct((runs, *s.shape), s.dtype) for k, s in spec.items()}

        # live[p]: the run at position p of the state's run axis. A run that fails leaves the state (risk 8:
        # it is no longer computed); the step is recompiled for the runs still alive.
        live = list(range(R))
        skipped_by_run = [None] * R
        window: list[tuple[int, dict]] = []
        compile_seconds = timed_seconds = eval_seconds = 0.0
        timed_steps, step, last_saved = 0, start_step, start_step

        def alive() -> list[int]:
            return [r for r in live if status[r] == "ok"]

        def check_window(fetched: list) -> None:
            for p, r in enumerate(live):
                bad = nonfinite.first_bad([(s, {k: v[p] for k, v in m.items()}) for s, m in fetched])
                if bad is not None and t.nonfinite == "stop":
                    status[r] = "failed"
                    errors[r] = (nonfinite.describe(*bad, None, None) + " (trained in a group; train it alone "
                                 "for the name of the first non-finite gradient)")
                    print(f"run {os.path.basename(workdirs[r])}: {errors[r]}; the group goes on without it",
                          flush=True)
                elif bad is not None:
                    print(f"warning: run {os.path.basename(workdirs[r])}: non-finite loss or gradient at step "
                          f"{bad[0]}; update skipped (train.nonfinite='skip')", flush=True)

        with preemption_signals() as stop:  # a signal checkpoints the runs, then stops
            try:
                with jax.set_mesh(mesh):
                    t0 = time.time()
                    step_fn = compile_step(train_step, states, stacked_spec(R))
                    compile_seconds = time.time() - t0
                    window_start, window_steps = time.time(), 0
                    while step < t.steps and alive():
                        if stop["signal"] is not None or (stop_at is not None and step >= stop_at):
                            raise Preempted()
                        rows = [next(data_its[r]) for r in live]
                        states, m = step_fn(states, {k: np.stack([b[k] for b in rows]) for k in rows[0]})
                        step, window_steps = step + 1, window_steps + 1
                        window.append((step, {"loss": m["loss"], "finite": m["finite"]}))
                        is_log = step % t.log_every == 0 or step == t.steps
                        is_eval = step % t.eval_every == 0 or step == t.steps
                        is_ckpt = step % t.checkpoint_every == 0 or step == t.steps
                        if is_log or is_eval or is_ckpt:
                            fetched, window = jax.device_get(window), []
                            check_window(fetched)
                            keep = [p for p, r in enumerate(live) if status[r] == "ok"]
                            if len(keep) < len(live):  # drop the failed runs from the state and the step
                                skipped = _skipped_updates(states)
                                for p, r in enumerate(live):
                                    skipped_by_run[r] = None if skipped is None else skipped[p]
                                m = jax.tree.map(lambda x: x[np.asarray(keep)], m)
                                fetched = [(s_, jax.tree.map(lambda x: x[np.asarray(keep)], x_)) for s_, x_ in fetched]
                                live = [live[p] for p in keep]
                                if not live:
                                    break
                                states = jax.tree.map(lambda x: x[np.asarray(keep)], states)
                                t0 = time.time()
                                step_fn = compile_step(train_step, states, stacked_spec(len(live)))
                                compile_seconds += time.time() - t0
                        if is_log or is_eval:
                            m = jax.device_get(m)
                            elapsed = time.time() - window_start
                            timed_seconds, timed_steps = timed_seconds + elapsed, timed_steps + window_steps
                            tps = len(live) * window_steps * tokens_per_step / max(elapsed, 1e-9)  # the group's
                            skipped = _skipped_updates(states)
                            if is_eval:
                                t_eval = time.time()
                                evals = evaluate(eval_fn, states.params, task, config, batch_s, 0, 1)  # lists of R
                                eval_seconds += time.time() - t_eval
                            for p, r in enumerate(live):
                                row = {"train_loss": float(m["loss"][p]),
                                       "learning_rate": float(schedules[r](step - 1)),
                                       "grad_norm": float(m["grad_norm"][p]), "tokens": step * tokens_per_step,
                                       "flops": step * tokens_per_step * fpt, "tokens_per_second": tps}
                                if skipped is not None:
                                    row["skipped_updates"] = skipped_by_run[r] = skipped[p]
                                spike = spikes[r].check([(s, {k: v[p] for k, v in x.items()}) for s, x in fetched],
                                                        row["train_loss"])
                                if spike is not None:
                                    row["loss_spike"] = spike[1]
                                if is_eval:
                                    row.update({k: v[p] for k, v in evals.items()})
                                last[r].update({k: row[k] for k in LAST_KEYS if k in row})
                                writers[r].write(step, row)
                            if verbose:
                                at = {r: p for p, r in enumerate(live)}
                                losses = " ".join(f"{float(m['loss'][at[r]]):.4f}" if r in at else "failed"
                                                  for r in range(R))
                                print(f"step {step:>6}/{t.steps} | losses {losses} | {tps:9,.0f} tok/s (group)",
                                      flush=True)
                            window_start, window_steps = time.time(), 0
                        if is_ckpt:
                            for p, r in enumerate(live):
                                ckpts[r].save(step, _run_state(states, p), data_its[r], resolved[r], force=True)
                            last_saved = step
            except Preempted:
                check_window(jax.device_get(window))  # never checkpoint a run's non-finite state
                for p, r in enumerate(live):
                    if status[r] != "ok":
                        continue
                    status[r] = "preempted"
                    if last_saved != step:
                        ckpts[r].save(step, _run_state(states, p), data_its[r], resolved[r], force=True)
                why = f"received signal {stop['signal']}" if stop["signal"] is not None else f"stop_at={stop_at}"
                print(f"{why}: checkpointed the group's runs at step {step}, exiting", flush=True)
        tps = R * timed_steps * tokens_per_step / timed_seconds if timed_seconds else None  # the group's
        skipped = _skipped_updates(states)
        for p, r in enumerate(live):
            skipped_by_run[r] = None if skipped is None else skipped[p]
        seconds = dict(wall=time.time() - t_start, compile=compile_seconds, train=timed_seconds, eval=eval_seconds)
        summaries = []
        for r in range(R):
            summary = make_summary(
                status=status[r], error=errors[r], step=step, steps=t.steps, counts=counts,
                tokens_per_step=tokens_per_step, fpt=fpt, last=last[r], task_name=task.name,
                skipped=skipped_by_run[r], seconds={k: v / R for k, v in seconds.items()},
                tps=tps, num_devices=1, mesh_shape=mesh_shape, multirun=R)
            write_json(os.path.join(workdirs[r], "summary.json"), summary)
            summaries.append(summary)
        if verbose:
            losses = ", ".join("-" if s["eval_loss"] is None else f"{s['eval_loss']:.4f}" for s in summaries)
            print(f"group done: eval_loss {losses}, {time.time() - t_start:.0f}s wall, "
                  f"{tps or 0:,.0f} tok/s (group)", flush=True)
        return summaries
    finally:
        for ck in ckpts:
            ck.close()
        for w in writers:
            w.close()

