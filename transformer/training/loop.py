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

`train_runs` reads top to bottom: set up (`_setup`), restore or initialise, then `Loop.run`'s cadence
(step; at log, eval and checkpoint steps a host sync that runs the guards, logs, evaluates, saves), then
the summaries. Evaluation is evaluation.py; preemption, non-finite steps and loss spikes are guards.py.

Legend: R runs, p a position on the state's run axis, r a run's index in `configs`.
"""
from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils

from transformer.tasks import get_task
from transformer.spec import metric_keys
from transformer.training import evaluators, guards, multirun, nonfinite, run_claim, run_setup, sharding, steps
from transformer.training.metrics import MetricsWriter, read_metrics
from transformer.training.profiler import ProfileWindow
from transformer.training.guards import Preempted
from transformer.training.run_io import Progress, abstract_batch, make_summary, write_json
from transformer.training.steps import global_batch
from transformer.training.run_setup import Runs, Setup


def compile_step(step_fn: Any, state: Any, batch_spec: dict) -> Any:
    """The train step compiled ahead of time for `state` (a group's: its run axis gives the runs)."""
    return step_fn.lower(state, batch_spec).compile()


def train(config: Any, workdir: str, *, verbose: bool = True, stop_at: int | None = None,
          claim_dead: run_claim.DeadRule | None = None) -> dict:
    """Runs (or resumes) training in `workdir`; returns the summary also written to summary.json.

    `stop_at`: behave as if preempted right after this step (checkpoint, status "preempted"). `claim_dead`: a
    caller's rule for when the holder of the workdir's claim is gone (run_claim.claim_workdirs).
    """
    return train_runs([config], [workdir], verbose=verbose, stop_at=stop_at, claim_dead=claim_dead)[0]


class Loop:
    """The cadence over one restored (or fresh) state: `run()` trains from `start_step` to train.steps."""

    def __init__(self, setup: Setup, runs: Runs, state: Any, start_step: int, preemption: guards.Preemption,
                 profile: ProfileWindow, verbose: bool):
        self.s, self.runs, self.state, self.preemption, self.profile = setup, runs, state, preemption, profile
        self.t, self.R, grouped = setup.spec.train, len(runs.specs), runs.grouped
        self.start_step = self.step = self.last_saved = start_step
        self.batch_s = sharding.batch_sharding(setup.mesh, setup.rules)
        self.train_batch_s = multirun.with_run_axis(self.batch_s) if grouped else self.batch_s
        self.use_dropout = setup.model_cfg.dropout_rate > 0
        train_step = steps.make_train_step(setup.model, setup.task, setup.tx, seed=self.t.seed,
                                           use_dropout=self.use_dropout,
                                           loss_chunk_size=self.t.loss_chunk_size,
                                           grad_accum_steps=self.t.grad_accum_steps)
        self.train_jit, self.eval_fn = steps.jit_steps(train_step, steps.make_eval_step(setup.model, setup.task),
                                                       setup.shardings, setup.mesh, setup.rules,
                                                       runs=self.R if grouped else 0)
        self.evaluators = evaluators.build(setup, self.eval_fn, self.batch_s, jax.process_index(),  # one registry:
                                           jax.process_count(), runs=self.R if grouped else 0)  # own split, sets, tasks
        self.train_fn: Any = None
        self.nonfinite = guards.NonFiniteGuard(self.t.nonfinite, runs.workdirs, grouped, runs.primary, self._diagnose,
                                               self.t.steps, self.t.max_skipped_fraction)
        histories = [read_metrics(w) if runs.primary and start_step else [] for w in runs.workdirs]  # to the ckpt
        for r, history in enumerate(histories):
            for row in history:
                runs.last[r].update({k: v for k, v in row.items() if metric_keys.keeps_last(k)})
        self.spikes = guards.SpikeGuard([[row.get("train_loss") for row in h] for h in histories], runs.workdirs,
                                        runs.describe_batch, runs.primary)
        self.progress = Progress(self.t.steps, verbose and runs.primary)
        self.window: list[tuple[int, dict]] = []  # this window's per-step (loss, finite), fetched at the next sync
        self.compile_seconds = self.timed_seconds = self.eval_seconds = 0.0
        self.timed_tokens = 0
        # XLA:CPU runs simulated devices on one shared thread pool: with two multi-device steps in flight,
        # a collective's rendezvous can starve past XLA's 40 s limit and abort the process. On CPU each step
        # therefore completes before the next is dispatched (nothing is lost: there is no device queue to fill).
        self.serialize_steps = jax.devices()[0].platform == "cpu" and len(setup.devices) > 1

    # ---- the cadence -------------------------------------------------------------------------------------
    def run(self) -> None:
        """Steps to train.steps (or a preemption: Preempted); a resumed run that is already there evaluates."""
        with jax.set_mesh(self.s.mesh), nn.logical_axis_rules(self.s.rules):
            self._compile(len(self.runs.live))
            self.window_start, self.window_steps = time.time(), 0
            while self.step < self.t.steps and self.runs.live:
                if self.preemption.should_stop(self.step):
                    raise Preempted()
                m = self._train_one_step()
                is_log = self.step % self.t.log_every == 0 or self.step == self.t.steps
                is_eval = self.step % self.t.eval_every == 0 or self.step == self.t.steps
                is_ckpt = (self.step % self.t.checkpoint_every == 0 or self.step == self.t.steps
                           or self.step == self.s.decay_start)
                if is_log or is_eval or is_ckpt:  # a host sync: check every step since the last one
                    fetched, m = self._sync(m)
                    if not self.runs.live:
                        break
                    if is_log or is_eval:
                        self._log(m, fetched, is_eval)
                if is_ckpt:
                    self.runs.save(self.step, self.state)  # data_its have yielded `step` batches
                    self.last_saved = self.step
            if self._final_evaluation_missing():  # resumed at the end
                final = self._evaluate()
                for p, r in enumerate(self.runs.live):
                    self.runs.last[r].update({k: self.runs.pick(v, p) for k, v in final.items()})

    def judge_end(self) -> None:
        """At the last step: a run whose final evaluation is not finite fails (its parameters are not a model; under
        train.nonfinite="skip" every update may have been finite where the evaluation is not)."""
        if self.step != self.t.steps:
            return
        for r in self.runs.live:
            loss = self.runs.last[r].get("eval_loss")
            if loss is not None and not np.isfinite(loss):
                self._fail({r: f"the final evaluation at step {self.step} is not finite (eval_loss={loss}): the "
                               f"model diverged. Lower train.learning_rate or raise train.warmup_steps"})

    def stop(self) -> None:
        """After Preempted: the steps since the last sync are checked (never save a NaN state), then saved."""
        self._fail(self.nonfinite.check(jax.device_get(self.window), self.runs.live, self.runs.part, self.step,
                                        replay=False))
        if self.last_saved != self.step:
            self.runs.save(self.step, self.state)
        for r in self.runs.live:
            self.runs.status[r] = "preempted" if self.runs.status[r] == "ok" else self.runs.status[r]

    # ---- its parts ---------------------------------------------------------------------------------------
    def _batch_spec(self, n: int) -> dict:
        spec = abstract_batch(self.s.task, self.s.spec, self.batch_s)
        if not self.runs.grouped:
            return spec
        return {k: jax.ShapeDtypeStruct((n, *a.shape), a.dtype, sharding=self.train_batch_s) for k, a in spec.items()}

    def _compile(self, n: int) -> None:
        t0 = time.time()
        self.train_fn = compile_step(self.train_jit, self.state, self._batch_spec(n))
        self.compile_seconds += time.time() - t0

    def _train_one_step(self) -> dict:
        self.profile.before(self.step + 1)
        batch = self.runs.next_batch(self.batch_s, self.train_batch_s)
        self.state, m = self.train_fn(self.state, batch)  # dispatched asynchronously
        if self.serialize_steps:
            jax.block_until_ready(m)
        self.step, self.window_steps = self.step + 1, self.window_steps + 1
        self.profile.after(self.step, (self.state, m))
        self.window.append((self.step, {"loss": m["loss"], "finite": m["finite"]}))  # device scalars: no sync
        return m

    def _fail(self, failed: dict[int, str]) -> None:
        for r, error in failed.items():
            self.runs.status[r], self.runs.errors[r] = "failed", error

    def _sync(self, m: dict) -> tuple[list, dict]:
        """Fetches the window's (loss, finite), runs the non-finite guard (before any checkpoint of a bad
        state) and takes failed runs out of the group: no longer computed (the step is recompiled)."""
        fetched, self.window = jax.device_get(self.window), []
        failed = self.nonfinite.check(fetched, self.runs.live, self.runs.part, self.step)
        counts = nonfinite.skipped_updates(self.state.opt_state) if self.t.nonfinite == "skip" else None
        if counts is not None:  # train.nonfinite="skip": too many dropped updates fail the run
            for p, r in enumerate(self.runs.live):
                self.runs.skipped[r] = self.runs.pick(counts, p)
            failed.update({r: e for r, e in self.nonfinite.over_limit(
                {r: self.runs.skipped[r] for r in self.runs.live}, self.step).items() if r not in failed})
        self._fail(failed)
        keep = [p for p, r in enumerate(self.runs.live) if self.runs.status[r] == "ok"]
        if len(keep) < len(self.runs.live) and not self.runs.grouped:  # a run alone failed: the loop ends
            self.runs.live = []
        elif len(keep) < len(self.runs.live):
            fetched = [(s, multirun.take(x, keep)) for s, x in fetched]
            m, self.runs.live = multirun.take(m, keep), [self.runs.live[p] for p in keep]
            if self.runs.live:
                self.state = multirun.take(self.state, keep)
                self._compile(len(self.runs.live))
        return fetched, m

    def _evaluate(self) -> dict:
        t0 = time.time()
        out = self.evaluators(self.state.params)
        self.eval_seconds += time.time() - t0
        return out

    def _log(self, m: dict, fetched: list, is_eval: bool) -> None:
        """One row per live run (metrics.jsonl, TensorBoard, W&B), spikes flagged, the progress line."""
        runs, step = self.runs, self.step
        m = jax.device_get(m)
        elapsed = time.time() - self.window_start
        tokens = len(runs.live) * self.window_steps * self.s.tokens_per_step
        self.timed_tokens += tokens
        self.timed_seconds += elapsed
        tps = tokens / max(elapsed, 1e-9)
        evals = self._evaluate() if is_eval else None
        extra = ""
        for p, r in enumerate(runs.live):
            mp = runs.part(m, p)
            row = {"train_loss": float(mp["loss"]), "learning_rate": float(runs.schedules[r](step - 1)),
                   "grad_norm": float(mp["grad_norm"]), "tokens": step * self.s.tokens_per_step,
                   "flops": step * self.s.tokens_per_step * self.s.fpt, "tokens_per_second": tps}
            row.update({f"rms/{kind}/{module}": float(v) for kind, per_module in mp["rms"].items()
                        for module, v in per_module.items()})  # per-module RMS (steps.module_rms)
            if self.t.nonfinite == "skip":  # counted at this sync (_sync)
                row["skipped_updates"] = runs.skipped[r]
            spike = self.spikes.check(r, [(s, runs.part(x, p)) for s, x in fetched], row["train_loss"])
            if spike is not None:
                row["loss_spike"] = spike[1]
                extra += f" | loss spike x{spike[1]:.1f} at step {spike[0]}"
            if evals is not None:
                row.update({k: runs.pick(v, p) for k, v in evals.items()})
                extra += f" | eval {row['eval_loss']:.4f}" if not runs.grouped else ""
            runs.last[r].update({k: v for k, v in row.items() if metric_keys.keeps_last(k)})
            runs.writers[r].write(step, row)
        at = {r: p for p, r in enumerate(runs.live)}
        self.progress(step, [float(runs.part(m, at[r])["loss"]) if r in at else None for r in range(self.R)],
                      tps, elapsed / self.window_steps, extra)
        self.window_start, self.window_steps = time.time(), 0

    def _final_evaluation_missing(self) -> bool:
        """Resumed at the last step without its evaluation in metrics.jsonl? Only process 0 reads the history,
        so its answer is every process's: the evaluation is a collective that all of them run, or none."""
        missing = bool(self.runs.live) and self.step == self.t.steps and any(
            self.runs.last[r].get("eval_loss") is None for r in self.runs.live)
        if jax.process_count() > 1:
            missing = bool(multihost_utils.broadcast_one_to_all(np.array(missing, np.int32)))
        return missing

    def _diagnose(self, bad_step: int, bad_loss: float) -> str:
        s, t = self.s, self.t
        grad_fn = nonfinite.make_grad_fn(s.model, s.task, seed=t.seed, use_dropout=self.use_dropout,
                                         loss_chunk_size=t.loss_chunk_size, grad_accum_steps=t.grad_accum_steps)
        return guards.replay_diagnosis(
            bad_step, bad_loss, checkpointer=self.runs.ckpts[0], abstract=s.abstract,
            make_iterator=lambda: s.task.make_iterator(s.spec, **self.runs.data_args[0]),
            fresh_state=lambda: s.fresh_state(s.spec, self.runs.init_sources[0]), train_fn=self.train_fn,
            grad_fn=grad_fn,
            to_global=lambda b: global_batch(b, self.batch_s, t.batch_size))

    def skipped_now(self) -> None:
        """Each live run's skipped updates from the state (train.nonfinite="skip"), for its summary; those
        logged last when a failed step had consumed (donated) the state."""
        if any(isinstance(x, jax.Array) and x.is_deleted() for x in jax.tree.leaves(self.state.opt_state)):
            return
        final_skipped = nonfinite.skipped_updates(self.state.opt_state)
        if final_skipped is not None:
            for p, r in enumerate(self.runs.live):
                self.runs.skipped[r] = self.runs.pick(final_skipped, p)


def train_runs(configs: Sequence[Any], workdirs: Sequence[str], *, verbose: bool = True,
               stop_at: int | None = None, claim_dead: run_claim.DeadRule | None = None) -> list[dict]:
    """Trains (or resumes) R runs of one shape; returns their summaries (also in each summary.json).

    R > 1 raises GroupMismatch, before any training, when the runs' checkpoints are at different steps.
    """
    t_start, nproc, R = time.time(), jax.process_count(), len(configs)
    run_setup.check_group(configs, nproc)
    setup, runs, previous, _ = run_setup.prepare(configs, workdirs, verbose, get_task, claim_dead)
    if setup is None:
        return previous
    loop: Loop | None = None
    profile: ProfileWindow | None = None
    completed = False  # False while an error is on its way out: closing must not replace it
    try:  # from here on the workdirs are claimed (runs.claims): released whatever happens
        profile = ProfileWindow(setup.config, workdirs[0], enabled=runs.primary)  # a group's trace is in run 0
        preemption = guards.Preemption(stop_at, nproc)
        with preemption:
            start_step, state = run_setup.restore_or_init(setup, runs, verbose)
            if verbose and runs.primary:
                run_setup.announce(setup, runs, start_step)
            runs.writers = [MetricsWriter(w, enabled=runs.primary, resume_step=start_step, config=d)  # + W&B
                            for w, d in zip(workdirs, runs.resolved)]
            loop = Loop(setup, runs, state, start_step, preemption, profile, verbose)
            del state
            error = _train(loop, preemption)
            error = _await_checkpoints(runs, error)  # before any summary says "ok" (or "preempted")
            loop.skipped_now()
            summaries = _summaries(setup, runs, loop, loop.step, time.time() - t_start)
            if runs.primary:  # with the run's error on its way (a disk full at a checkpoint has no room for the
                # summary either) a summary that cannot be written is a warning, and the run's error is raised
                _call_all([(f"{workdir}/summary.json not written after the run failed",
                            functools.partial(_write_summary, workdir, summary, writer))
                           for workdir, summary, writer in zip(workdirs, summaries, runs.writers)],
                          raise_errors=error is None)
            if error is not None:
                raise error
        completed = True
    finally:
        closers = [*([profile.close] if profile is not None else []),
                   *([loop.evaluators.close] if loop is not None else []),
                   *(ck.close for ck in runs.ckpts), *(w.close for w in runs.writers)]
        if nproc > 1:
            closers.append(lambda: multihost_utils.sync_global_devices("train_done"))
        closers.append(runs.claims.release)  # the workdirs' claims last: their files are all closed
        _call_all([("while closing after the run failed", close) for close in closers], raise_errors=completed)
    if verbose and runs.primary and all(s["status"] == "ok" for s in summaries):
        losses = ", ".join("-" if s["eval_loss"] is None else f"{s['eval_loss']:.4f}" for s in summaries)
        print(f"done: eval_loss {losses}, {summaries[0]['wall_seconds'] * R:.0f}s wall, "
              f"{(summaries[0]['tokens_per_second'] or 0):,.0f} tok/s", flush=True)
    return summaries


def _train(loop: Loop, preemption: guards.Preemption) -> BaseException | None:
    """Runs the loop to its end or a preemption (checkpointed). Returns the error that ended it instead (its
    live runs marked failed with it), to be raised once their summaries are written."""
    runs = loop.runs
    try:
        try:
            loop.run()
            loop.judge_end()
        except Preempted:
            loop.stop()
            if runs.primary:
                lead = runs.live[0]
                print(f"{preemption.reason()}: checkpointed step {loop.step}, exiting"
                      if runs.status[lead] == "preempted" else f"{preemption.reason()}: {runs.errors[lead]}",
                      flush=True)
        return None
    except BaseException as e:  # noqa: BLE001 - recorded in summary.json, then raised
        for r in runs.live:
            runs.status[r], runs.errors[r] = "failed", f"{type(e).__name__}: {e}"
        return e


def _await_checkpoints(runs: Runs, error: BaseException | None) -> BaseException | None:
    """Waits for the runs' asynchronous saves: their last checkpoints are durable before a summary.json says
    so. A save that failed fails its run (if nothing failed it before); returns the error to raise."""
    for r, ck in enumerate(runs.ckpts):
        try:
            ck.wait()
        except Exception as e:  # noqa: BLE001 - recorded in summary.json, then raised
            if runs.status[r] != "failed":
                runs.status[r], runs.errors[r] = "failed", f"the last checkpoint was not saved: {type(e).__name__}: {e}"
            error = error or e
    return error


def _write_summary(workdir: str, summary: dict, writer: MetricsWriter) -> None:
    """summary.json, and the W&B run's summary (logging.wandb)."""
    write_json(os.path.join(workdir, "summary.json"), summary)
    writer.set_summary(summary)


def _call_all(calls: list[tuple[str, Callable[[], Any]]], raise_errors: bool) -> None:
    """Calls every (label, call) in turn (the closers, the summaries' writes). The first error is raised after all
    ran; when another error is already on its way (`raise_errors` False) each is only printed, `warning: LABEL: …`:
    the caller must see the run's own error."""
    first = None
    for label, call in calls:
        try:
            call()
        except Exception as e:  # noqa: BLE001 - see the docstring
            first = first or e
            if not raise_errors:
                print(f"warning: {label}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    if first is not None and raise_errors:
        raise first


def _summaries(setup: Setup, runs: Runs, loop: Loop, step: int, wall: float) -> list[dict]:
    """Each run's summary.json (a group's times are shared: each run's are the group's / R)."""
    R = len(runs.specs)
    seconds = dict(wall=wall, compile=loop.compile_seconds, train=loop.timed_seconds, eval=loop.eval_seconds)
    return [make_summary(
        status=runs.status[r], error=runs.errors[r], step=step, steps=setup.spec.train.steps, counts=setup.counts,
        tokens_per_step=setup.tokens_per_step, fpt=setup.fpt, last=runs.last[r], task_name=setup.task.name,
        skipped=runs.skipped[r], seconds={k: v / R for k, v in seconds.items()},
        tps=loop.timed_tokens / loop.timed_seconds if loop.timed_seconds else None,
        num_devices=len(setup.devices), mesh_shape=setup.mesh_shape, train_split_tokens=setup.train_split_tokens,
        split_tokens_per_step=setup.split_tokens_per_step, model_cfg=setup.model_cfg,
        vocab_size_unpadded=setup.vocab_size_unpadded,
        eval_train_overlap_documents=setup.eval_train_overlap_documents,
        **({"multirun": R} if runs.grouped else {})) for r in range(R)]
