"""The training loop: config → data → sharded state → jitted steps → metrics, checkpoints, summary.

One loop trains R >= 1 runs of one shape. `train(config, workdir)` is R = 1: the whole Train contract
(docs/design.md); rerunning it on the same workdir resumes from the latest checkpoint (model, optimizer,
data position; the dropout RNG is derived from (seed, step)) and ends with the same result as an
uninterrupted run. `train_runs(configs, workdirs)` with R > 1 is a group (sweep.multirun): runs that
differ only in learning rate and seed (multirun.group_key), stacked on a leading run axis and trained by
one vmapped step on one device. Every run, grouped or not, gets the same files in its own workdir
(config.json, metrics.jsonl, checkpoints in one layout, summary.json), so a run checkpointed in a group
resumes alone and the other way round. A group's times are shared: each run's wall/compile/train/eval
seconds are the group's / R, and tokens_per_second and mfu are the group's.

Legend: R runs, p a position on the state's run axis, r a run's index in `configs`.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils

from transformer.spec import ConfigError
from transformer.data import get_tokenizer, record_tokenizer
from transformer.data.batches import process_rows
from transformer.models import build_model
from transformer.spec import flops_per_token, param_counts
from transformer.tasks import get_task, model_vocab_size
from transformer.training import checkpointing, multirun, nonfinite, optimizer, sharding, steps
from transformer.training.metrics import MetricsWriter, read_metrics
from transformer.training.optimizer import make_schedule, with_peak_lrs
from transformer.training.profiler import ProfileWindow
from transformer.training.resolve import resolve
from transformer.training.run_io import (Preempted, Progress, abstract_batch, check_workdir_config,  # noqa: F401
                                         evaluate, global_batch, make_summary, preemption_signals, write_json)
from transformer.training.state import abstract_state, init_state, model_optimizer
from transformer.training.warm_start import warm_start

# a run's last logged values go to its summary
LAST_KEYS = ("train_loss", "eval_loss", "eval_accuracy", "eval_bits_per_byte")


def compile_step(step_fn: Any, state: Any, batch_spec: dict) -> Any:
    """The train step compiled ahead of time for `state` (a group's: its run axis gives the runs)."""
    return step_fn.lower(state, batch_spec).compile()


def train(config: Any, workdir: str, *, verbose: bool = True, stop_at: int | None = None) -> dict:
    """Runs (or resumes) training in `workdir`; returns the summary also written to summary.json.

    `stop_at`: behave as if preempted right after this step (checkpoint, status "preempted").
    """
    return train_runs([config], [workdir], verbose=verbose, stop_at=stop_at)[0]


def train_runs(configs: Sequence[Any], workdirs: Sequence[str], *, verbose: bool = True,
               stop_at: int | None = None) -> list[dict]:
    """Trains (or resumes) R runs of one shape; returns their summaries (also in each summary.json).

    R > 1 raises GroupMismatch, before any training, when the runs' checkpoints are at different steps.
    """
    t_start = time.time()
    R, grouped = len(configs), len(configs) > 1
    pid, nproc = jax.process_index(), jax.process_count()
    primary = pid == 0
    if grouped and nproc != 1:
        raise ConfigError(f"sweep.multirun trains a group in one process, but this job has {nproc} processes; "
                          f"set sweep.multirun=False")
    if grouped and len({multirun.group_key(c) for c in configs} | {None}) != 2:
        raise ValueError(f"a group's runs may differ only in train.{' and train.'.join(multirun.FREE_KEYS)} "
                         "(no dropout, no train.init_from)")
    devices = jax.devices()[:1] if grouped else jax.devices()
    config, t = configs[0], configs[0].train
    tokenizer = get_tokenizer(config.data, workdir=workdirs[0], training=True)  # the recorded copy when resuming
    runs = [resolve(c, len(devices), nproc, tokenizer) for c in configs]
    model_cfg, mesh_shape, resolved = runs[0].model_cfg, runs[0].mesh_shape, [r.config for r in runs]
    previous, continue_from = [], []
    for workdir, d in zip(workdirs, resolved):
        os.makedirs(workdir, exist_ok=True)
        continue_from.append(check_workdir_config(workdir, json.loads(json.dumps(d))))  # a wsd run made longer
        path = os.path.join(workdir, "summary.json")
        if os.path.exists(path) and continue_from[-1] is None:
            with open(path) as f:
                previous.append(json.load(f))
        else:
            previous.append(None)
    if all(p is not None and p.get("status") == "ok" for p in previous):
        if verbose and primary:
            print(f"{', '.join(workdirs)} already finished (status ok); nothing to do", flush=True)
        return previous

    task, model = get_task(config), build_model(model_cfg)
    tx = model_optimizer(model, t, task.init_inputs(config))  # with μP's per-parameter LRs (SP: none)
    schedules = [make_schedule(c.train) for c in configs]
    mesh, rules = sharding.make_mesh(config.mesh, devices), sharding.rules(config.mesh)
    counts = param_counts(model_cfg)
    fpt = flops_per_token(model_cfg, config.data.seq_len)["with_attention"]
    tokens_per_step = t.batch_size * config.data.seq_len  # per run

    # this process's rows of a global batch: those its devices hold (a tensor/fsdp axis may span processes)
    rows = process_rows(sharding.batch_sharding(mesh, rules), (t.batch_size, config.data.seq_len))
    # the data order: (data.shuffle_seed, train.seed) mixed by the pipeline (pipeline.shuffle_seed), never summed
    data_args = [dict(split=c.data.train_split, global_batch_size=t.batch_size, seed=c.train.seed, data=run.data,
                      rows=rows, process_index=pid, process_count=nproc, shuffle=True, repeat=True)
                 for c, run in zip(configs, runs)]
    data_its = [task.make_iterator(c, **a) for c, a in zip(configs, data_args)]
    train_split_tokens = getattr(data_its[0], "split_tokens", None)  # packed text: for `epochs`
    overlap = getattr(data_its[0], "eval_train_overlap_documents", None)  # packed text: eval documents seen in train
    token_bytes_V = tokenizer.byte_lengths() if task.name == "lm" else None  # for eval_bits_per_byte
    if primary:  # only once the data is found: a mistyped dataset leaves no half-made run behind
        for workdir, d in zip(workdirs, resolved):
            record_tokenizer(tokenizer, workdir)  # sampling and resuming need nothing outside the workdir
            write_json(os.path.join(workdir, "config.json"), d)
    decay_start = optimizer.decay_start(t)  # wsd: checkpointed and kept, a longer run continues from it
    ckpts = [checkpointing.Checkpointer(os.path.join(w, "checkpoints"), keep=t.keep_checkpoints,
                                        preserve=[decay_start] if decay_start else []) for w in workdirs]
    for ck, step_from in zip(ckpts, continue_from):
        if step_from is not None:
            ck.set_aside_after(step_from, f"continuing to {t.steps} steps from the decay start {step_from}")
    abstract, shardings = abstract_state(model, tx, task.init_inputs(config), mesh, rules)

    def fresh_state(c: Any, announce: bool = False) -> Any:
        """Step 0: initialised from the run's seed with its peak learning rate, warm-started when asked."""
        state, _ = init_state(model, tx, c.train.seed, task.init_inputs(c), mesh, rules)
        state = state.replace(opt_state=with_peak_lrs(state.opt_state, float(c.train.learning_rate)))
        if c.train.get("init_from"):
            state, copied = warm_start(state, c.train.init_from)
            if announce and verbose and primary:
                print(f"warm start from {c.train.init_from}: {len(copied['copied'])} parameters copied, "
                      f"{len(copied['kept'])} freshly initialised ({', '.join(copied['kept'][:4])}"
                      f"{', ...' if len(copied['kept']) > 4 else ''})", flush=True)
        return state

    writers: list[MetricsWriter] = []
    profile = ProfileWindow(config, workdirs[0], enabled=primary)  # logging.profile_*: a group's trace is in run 0
    signals = contextlib.ExitStack()  # the handlers come back in the `finally` below
    try:
        restored = [ck.restore(abstract, it) for ck, it in zip(ckpts, data_its)]
        at = sorted({r[0] if r else 0 for r in restored})
        if len(at) > 1:
            raise multirun.GroupMismatch(f"the runs' checkpoints are at steps {at}; they continue one by one")
        start_step = at[0]  # the iterators are at global batch start_step, under any process count
        run_states = [r[1] if r else fresh_state(c, announce=True) for r, c in zip(restored, configs)]
        state = (jax.device_put(multirun.stack(run_states), multirun.with_run_axis(shardings)) if grouped
                 else run_states[0])
        del run_states, restored
        if verbose and primary:
            what = (f"group of {R} runs (learning rates {', '.join(f'{c.train.learning_rate:.3g}' for c in configs)})"
                    if grouped else workdirs[0])
            print(f"{model_cfg.family} model: {counts['total']:,} params ({counts['non_embedding']:,} non-embedding), "
                  f"{fpt / 1e6:.2f} MFLOP/token; mesh {dict(zip(sharding.MESH_AXES, mesh_shape))}; "
                  f"{'resuming from step ' + str(start_step) if start_step else 'starting'}: {what}", flush=True)
        writers = [MetricsWriter(w, enabled=primary, resume_step=start_step, config=d)  # + W&B (logging.wandb)
                   for w, d in zip(workdirs, resolved)]
        last = [{} for _ in range(R)]  # a resumed run's last logged values
        spikes = []
        for r, w in enumerate(workdirs):
            history = read_metrics(w) if primary and start_step else []  # rows up to the checkpoint
            for row in history:
                last[r].update({k: row[k] for k in LAST_KEYS if k in row})
            spikes.append(nonfinite.SpikeDetector([row.get("train_loss") for row in history]))

        batch_s = sharding.batch_sharding(mesh, rules)
        train_batch_s = multirun.with_run_axis(batch_s) if grouped else batch_s
        use_dropout = model_cfg.dropout_rate > 0
        train_step = steps.make_train_step(model, task, tx, seed=t.seed, use_dropout=use_dropout,
                                           loss_chunk_size=t.get("loss_chunk_size", 0))
        train_jit, eval_fn = steps.jit_steps(train_step, steps.make_eval_step(model, task), shardings, mesh, rules,
                                             runs=R if grouped else 0)
        spec = abstract_batch(task, config, batch_s)

        def batch_spec(n: int) -> dict:
            if not grouped:
                return spec
            return {k: jax.ShapeDtypeStruct((n, *s.shape), s.dtype, sharding=train_batch_s) for k, s in spec.items()}

        def diagnose(bad_step: int, bad_loss: float) -> str:
            """A run alone: replays from the newest checkpoint (all are older than bad_step) to the state before
            it and recomputes that batch's gradients, to name the first non-finite one."""
            try:
                ckpts[0].wait()
                it = task.make_iterator(config, **data_args[0])
                found = ckpts[0].restore(abstract, it)
                from_step, st = found if found is not None else (0, fresh_state(config))
                for _ in range(from_step, bad_step - 1):
                    st, _ = train_fn(st, global_batch(next(it), batch_s, t.batch_size))
                grad_fn = nonfinite.make_grad_fn(model, task, seed=t.seed, use_dropout=use_dropout,
                                                 loss_chunk_size=t.get("loss_chunk_size", 0))
                _, grads = grad_fn(st.params, global_batch(next(it), batch_s, t.batch_size), st.step)
                return nonfinite.describe(bad_step, bad_loss, nonfinite.nonfinite_leaves(grads),
                                          from_step if found is not None else None)
            except Exception as e:  # noqa: BLE001 - the diagnosis must not hide the fault itself
                return nonfinite.describe(bad_step, bad_loss, None, None) + f" ({type(e).__name__}: {e})"

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

        live = list(range(R))  # live[p]: the run at position p of the state's run axis
        status, errors = ["ok"] * R, [None] * R
        skipped = [None] * R

        def per_run(tree: Any, p: int) -> Any:
            """Run p's slice of a tree of arrays (a group's), or the tree itself (a run alone)."""
            return multirun.unstack(tree, p) if grouped else tree

        def pick(values: Any, p: int) -> Any:
            """Run p's entry of a group's list (evaluate's, skipped_updates'), or the value itself."""
            return values[p] if grouped else values

        def check_window(fetched: list, replay: bool = True) -> None:
            """Non-finite steps since the last sync: under train.nonfinite="stop" a run alone raises with a
            diagnosis (`replay`: replayed from its checkpoint) and a group's run fails and leaves it; under
            "skip", a warning."""
            for p, r in enumerate(live):
                bad = nonfinite.first_bad([(s, per_run(x, p)) for s, x in fetched])
                if bad is None:
                    continue
                if t.nonfinite == "stop" and not grouped and replay:
                    raise nonfinite.NonFiniteError(diagnose(*bad))
                if t.nonfinite == "stop":
                    status[r] = "failed"
                    errors[r] = nonfinite.describe(*bad, None, None) + (
                        " (trained in a group; train it alone for the name of the first non-finite gradient)"
                        if grouped else "")
                    if grouped:
                        print(f"run {os.path.basename(workdirs[r])}: {errors[r]}; the group goes on without it",
                              flush=True)
                elif primary:
                    n_bad = sum(1 for _, x in fetched if not bool(np.asarray(per_run(x, p)["finite"])))
                    print(f"warning: {workdirs[r]}: non-finite loss or gradient at step {bad[0]}"
                          f"{f' and {n_bad - 1} more steps up to {step}' if n_bad > 1 else ''}; "
                          f"update skipped (train.nonfinite='skip')", flush=True)

        progress = Progress(t.steps, verbose and primary)
        window: list[tuple[int, dict]] = []  # this window's per-step (loss, finite), fetched at the next sync
        compile_seconds = timed_seconds = eval_seconds = 0.0
        timed_tokens, step, last_saved = 0, start_step, start_step
        # XLA:CPU runs simulated devices on one shared thread pool: with two multi-device steps in flight,
        # a collective's rendezvous can starve past XLA's 40 s limit and abort the process. On CPU each step
        # therefore completes before the next is dispatched (nothing is lost: there is no device queue to fill).
        serialize_steps = jax.devices()[0].platform == "cpu" and len(devices) > 1

        def save(at_step: int) -> None:
            for p, r in enumerate(live):
                if status[r] == "ok":
                    ckpts[r].save(at_step, per_run(state, p), data_its[r], resolved[r], force=True)

        try:
            with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
                t0 = time.time()
                train_fn = compile_step(train_jit, state, batch_spec(R))
                compile_seconds = time.time() - t0
                window_start, window_steps = time.time(), 0
                while step < t.steps and live:
                    if should_stop(sync_point=step == start_step or step % t.log_every == 0):
                        raise Preempted()
                    profile.before(step + 1)
                    if grouped:
                        rows = [next(data_its[r]) for r in live]
                        batch = global_batch({k: np.stack([b[k] for b in rows]) for k in rows[0]}, train_batch_s)
                    else:
                        batch = global_batch(next(data_its[0]), batch_s, t.batch_size)  # overlaps the previous step
                    state, m = train_fn(state, batch)                      # dispatched asynchronously
                    if serialize_steps:
                        jax.block_until_ready(m)
                    step, window_steps = step + 1, window_steps + 1
                    profile.after(step, (state, m))
                    window.append((step, {"loss": m["loss"], "finite": m["finite"]}))  # device scalars: no sync
                    is_log = step % t.log_every == 0 or step == t.steps
                    is_eval = step % t.eval_every == 0 or step == t.steps
                    is_ckpt = step % t.checkpoint_every == 0 or step == t.steps or step == decay_start
                    if is_log or is_eval or is_ckpt:  # a host sync: check every step since the last one
                        fetched, window = jax.device_get(window), []
                        check_window(fetched)  # before any checkpoint of a bad state
                        keep = [p for p, r in enumerate(live) if status[r] == "ok"]
                        if len(keep) < len(live):  # failed runs leave the group: no longer computed (risk 8)
                            fetched = [(s, multirun.take(x, keep)) for s, x in fetched]
                            m, live = multirun.take(m, keep), [live[p] for p in keep]
                            if not live:
                                break
                            state = multirun.take(state, keep)
                            t0 = time.time()
                            train_fn = compile_step(train_jit, state, batch_spec(len(live)))
                            compile_seconds += time.time() - t0
                    if is_log or is_eval:
                        m = jax.device_get(m)
                        elapsed = time.time() - window_start
                        timed_tokens += len(live) * window_steps * tokens_per_step
                        timed_seconds += elapsed
                        tps = len(live) * window_steps * tokens_per_step / max(elapsed, 1e-9)
                        counts_skipped = nonfinite.skipped_updates(state.opt_state)
                        evals = None
                        if is_eval:
                            t_eval = time.time()
                            evals = evaluate(eval_fn, state.params, task, config, batch_s, pid, nproc, token_bytes_V,
                                             runs[0].data, rows)
                            eval_seconds += time.time() - t_eval
                        extra = ""
                        for p, r in enumerate(live):
                            mp = per_run(m, p)
                            row = {"train_loss": float(mp["loss"]), "learning_rate": float(schedules[r](step - 1)),
                                   "grad_norm": float(mp["grad_norm"]), "tokens": step * tokens_per_step,
                                   "flops": step * tokens_per_step * fpt, "tokens_per_second": tps}
                            if counts_skipped is not None:
                                row["skipped_updates"] = skipped[r] = pick(counts_skipped, p)
                            spike = spikes[r].check([(s, per_run(x, p)) for s, x in fetched], row["train_loss"])
                            if spike is not None:
                                row["loss_spike"] = spike[1]
                                extra += f" | loss spike x{spike[1]:.1f} at step {spike[0]}"
                                if primary:
                                    print(f"warning: {workdirs[r]}: loss spike at step {spike[0]}: {spike[1]:.2f}x the "
                                          f"median of the last {len(spikes[r].history) - 1} logged losses; its batch is "
                                          f"number {spike[0] - 1} of split {configs[r].data.train_split!r} shuffled with "
                                          f"data.shuffle_seed={configs[r].data.shuffle_seed}, train.seed="
                                          f"{configs[r].train.seed} (runs with both the same saw the same batch)",
                                          flush=True)
                            if evals is not None:
                                row.update({k: pick(v, p) for k, v in evals.items()})
                                extra += f" | eval {row['eval_loss']:.4f}" if not grouped else ""
                            last[r].update({k: row[k] for k in LAST_KEYS if k in row})
                            writers[r].write(step, row)
                        at = {r: p for p, r in enumerate(live)}
                        progress(step, [float(per_run(m, at[r])["loss"]) if r in at else None for r in range(R)],
                                 tps, elapsed / window_steps, extra)
                        window_start, window_steps = time.time(), 0
                    if is_ckpt:
                        save(step)  # data_its have yielded `step` batches
                        last_saved = step
                if live and step == t.steps and any(last[r].get("eval_loss") is None for r in live):
                    # resumed at the end
                    final = evaluate(eval_fn, state.params, task, config, batch_s, pid, nproc, token_bytes_V,
                                     runs[0].data, rows)
                    for p, r in enumerate(live):
                        last[r].update({k: pick(v, p) for k, v in final.items()})
        except Preempted:
            check_window(jax.device_get(window), replay=False)  # steps since the last sync: never save a NaN state
            if last_saved != step:
                save(step)
            for r in live:
                status[r] = "preempted" if status[r] == "ok" else status[r]
            if primary:
                why = f"received signal {stop['signal']}" if stop["signal"] is not None else f"stop_at={stop_at}"
                print(f"{why}: checkpointed step {step}, exiting" if status[live[0]] == "preempted" else
                      f"{why}: {errors[live[0]]}", flush=True)
        except Exception as e:
            for r in live:
                status[r], errors[r] = "failed", f"{type(e).__name__}: {e}"
            raise
        finally:
            final_skipped = nonfinite.skipped_updates(state.opt_state)
            if final_skipped is not None:
                for p, r in enumerate(live):
                    skipped[r] = pick(final_skipped, p)
            seconds = dict(wall=time.time() - t_start, compile=compile_seconds, train=timed_seconds, eval=eval_seconds)
            summaries = [make_summary(
                status=status[r], error=errors[r], step=step, steps=t.steps, counts=counts, model_cfg=model_cfg,
                vocab_size_unpadded=model_vocab_size(config, tokenizer),
                tokens_per_step=tokens_per_step, fpt=fpt, last=last[r], task_name=task.name, skipped=skipped[r],
                seconds={k: v / R for k, v in seconds.items()},
                tps=timed_tokens / timed_seconds if timed_seconds else None, num_devices=len(devices),
                mesh_shape=mesh_shape, train_split_tokens=train_split_tokens, eval_train_overlap_documents=overlap,
                **({"multirun": R} if grouped else {})) for r in range(R)]
            if primary:
                for workdir, summary, writer in zip(workdirs, summaries, writers):
                    write_json(os.path.join(workdir, "summary.json"), summary)
                    writer.set_summary(summary)  # the W&B run's summary (logging.wandb)
    finally:
        profile.close()
        signals.close()
        for ck in ckpts:
            ck.close()
        for w in writers:
            w.close()
        if nproc > 1:
            multihost_utils.sync_global_devices("train_done")
    if verbose and primary and all(s["status"] == "ok" for s in summaries):
        losses = ", ".join("-" if s["eval_loss"] is None else f"{s['eval_loss']:.4f}" for s in summaries)
        print(f"done: eval_loss {losses}, {summaries[0]['wall_seconds'] * R:.0f}s wall, "
              f"{(summaries[0]['tokens_per_second'] or 0):,.0f} tok/s", flush=True)
    return summaries
