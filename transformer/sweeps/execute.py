"""One run of a sweep, in this process: its training config from DIR/sweep.json (the sweep's data identity
included), its claim, the branch seed (a copy of its source run's decay-start checkpoint), training with retries,
its DIR/results.jsonl row, and what that row says: the one failure rule (`verdict`) every reader of the rows uses.

Used by the runner (transformer/sweeps/runner.py: one run after another, worker processes), by run groups
(transformer/sweeps/run_groups.py: sweep.multirun) and by the SLURM steps; it imports none of them, so the
dependency runs one way. Those executors only schedule: the config, the claim, the verdict, and what stops the
whole sweep (an EnvironmentFailure: a module no retry installs) are made here.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import time
import traceback
from typing import Any, Collection

from transformer import environment
from transformer.scaling import verdict as verdict_rule
from transformer.spec import ConfigError, MissingInputError
from transformer.sweeps import claims, results

SHAPE_KEYS = ("d_model", "num_layers", "num_heads", "head_dim", "d_ff")

# The one failure rule (ok / failed / diverged), in scaling/verdict.py so that the fit and compare read rows by it too.
OK, FAILED, DIVERGED = verdict_rule.OK, verdict_rule.FAILED, verdict_rule.DIVERGED
verdict, canonical, observed = verdict_rule.verdict, verdict_rule.canonical, verdict_rule.observed


def read_rows(workdir: str) -> list[dict[str, Any]]:
    """DIR/results.jsonl's rows, each `canonical`: what the design, the fit and the reports read."""
    return [canonical(r) for r in results.read_results(workdir)]


def drop_failed(workdir: str) -> list[str]:
    """--retry_failed: removes the rows of the FAILED runs (not the diverged: an observation, and trained again
    they diverge again), so those runs train again; returns their ids."""
    return results.remove_rows(workdir, lambda r: verdict(r)[0] == FAILED)


def initial_loss(workdir: str, run: dict[str, Any]) -> float | None:
    """The train loss of the first row of DIR/runs/RUN_ID/metrics.jsonl when it was logged in the run's first
    logging interval (a run that trained from step 0); None otherwise (a branch, or nothing logged)."""
    path = os.path.join(workdir, "runs", run["run_id"], "metrics.jsonl")
    every = int(run.get("config", {}).get("train", {}).get("log_every") or 0)
    try:
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                if "train_loss" in row:
                    loss = row["train_loss"]
                    ok = every and row.get("step", every + 1) <= every and isinstance(loss, (int, float))
                    return float(loss) if ok else None
    except (OSError, ValueError):
        return None
    return None


def result_row(run: dict[str, Any], summary: dict[str, Any] | None, status: str, error: str | None,
               wall_seconds: float, mode: str, initial: float | None = None) -> dict[str, Any]:
    """One results.jsonl row: the run's design numbers and shape, overlaid with what training measured; its
    status and error as `verdict` classifies them (`initial`: the run's initial_loss)."""
    s = summary or {}
    row = {k: run[k] for k in ("run_id", "budget", "params", "params_non_embedding", "size", "tokens", "flops",
                               "flops_per_token", "steps", "batch_size", "seq_len", "learning_rate",
                               "warmup_steps", *SHAPE_KEYS)}
    row.update({k: run.get(k, default) for k, default in (("role", "grid"), ("stage", ""), ("seed", 0),
                                                          ("schedule", None), ("branch_from", None))})
    row.update(mode=mode, status=status, error=error, eval_loss=s.get("eval_loss"),
               eval_bits_per_byte=s.get("eval_bits_per_byte"), epochs=s.get("epochs"),
               train_loss=s.get("train_loss"), wall_seconds=wall_seconds,
               tokens_per_second=s.get("tokens_per_second"), mfu=s.get("mfu"),
               compile_seconds=s.get("compile_seconds"), device=s.get("device"), initial_loss=initial,
               vocab_size_unpadded=s.get("vocab_size_unpadded"), environment=environment.brief(s.get("environment")),
               eval_sets=s.get("eval_sets") or {}, tasks=s.get("tasks") or {})  # data.eval_sets, train.eval_tasks
    if status == OK:  # measured values (equal to the design's when the run reached its last step)
        row.update({k: s[k] for k in ("params", "params_non_embedding", "params_unpadded", "tokens", "flops")
                    if k in s})
    return canonical(row)


CLAIMED_ELSEWHERE = 4  # exit code of a worker whose run another runner holds
ENVIRONMENT_EXIT = 7   # exit code of a worker stopped by an EnvironmentFailure (its `error:` line ends its log)
OWN_PACKAGES = ("transformer", "experiments", "configs")  # an import of these that fails is a bug, not the machine


class EnvironmentFailure(ConfigError):
    """A run failed for want of something in the environment that no retry can fix and that every later run needs
    too (a Python module or a shared library that is not installed): the sweep stops at the first one with this one
    `error:` line (exit 2), and the run stays unrecorded, so that the same command rerun after the fix trains it."""


def environment_failure(error: BaseException, run_id: str) -> EnvironmentFailure | None:
    """The EnvironmentFailure `error` (or an exception it was raised from or during) is, for run `run_id`: an
    ImportError of a package outside this project (ModuleNotFoundError: not installed; `cannot import name`: another
    version), or a shared library that cannot be loaded (`cannot open shared object file`: a missing CUDA library);
    None for anything else. An import of this project's own modules that fails is a bug (it keeps its traceback),
    and errors of the XLA runtime, CUDA's included, are retried: on the H100 a `ptxas exited with non-zero error
    code 15` trained on its retry."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text, name = str(error), getattr(error, "name", None) or ""
        if isinstance(error, ImportError) and name.split(".")[0] in OWN_PACKAGES:
            return None
        if isinstance(error, ModuleNotFoundError) and name:
            what = f"the Python module {name!r} is not installed ({text})"
            fix = (f"install the package that provides it (e.g. pip install {name.split('.')[0]}; on the lent GPU "
                   f"machine .ci/gpu_wheels.sh fetches the wheels .ci/gpu_check.sh installs)")
        elif isinstance(error, (ImportError, OSError)) and "cannot open shared object file" in text:
            what = f"a shared library is missing ({type(error).__name__}: {text})"
            fix = "install the package that provides it (a CUDA library: the jax[cuda13] extra's wheels)"
        elif isinstance(error, ImportError):
            what = f"{type(error).__name__}: {text}"
            fix = f"install the version of {name or 'the package'} pyproject.toml names"
        else:
            error = error.__cause__ or error.__context__
            continue
        return EnvironmentFailure(f"run {run_id} could not train: {what}; {fix}, then rerun the command: the sweep "
                                  f"stopped at this run, which is not recorded, and the rerun trains it")
    return None


def logged_environment_failure(log: str, run_id: str) -> EnvironmentFailure:
    """The EnvironmentFailure a worker process (or SLURM task) stopped with, exit ENVIRONMENT_EXIT: the last
    `error:` line of its `log`."""
    try:
        with open(log, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.startswith("error: ")]
    except OSError:
        lines = []
    return EnvironmentFailure(lines[-1].removeprefix("error: ") if lines else
                              f"run {run_id}: its worker stopped for want of something in its environment (exit "
                              f"{ENVIRONMENT_EXIT}); see {log}")


def run_config(workdir: str, run: dict[str, Any], doc: dict[str, Any] | None = None) -> dict[str, Any]:
    """A run's training config (a plain nested dict: training.resolve reads it by item access): its config in
    sweep.json with the sweep's data pin, data.identity, from `doc` or DIR/sweep.json (resolve refuses the run
    unless its data is the sweep's: data/identity.py); its W&B runs are grouped by sweep: logging.wandb_group,
    when unset, is the sweep directory's name (logging is not part of the run id)."""
    config = copy.deepcopy(run["config"])
    if doc is None:
        path = os.path.join(workdir, "sweep.json")
        doc = load_sweep(workdir) if os.path.exists(path) else {}
    if doc.get("data_identity"):
        config["data"]["identity"] = doc["data_identity"]
    if "logging" in config and not config["logging"].get("wandb_group"):
        config["logging"]["wandb_group"] = os.path.basename(os.path.normpath(workdir))
    return config


def load_sweep(workdir: str) -> dict[str, Any]:
    path = os.path.join(workdir, "sweep.json")
    if not os.path.exists(path):
        raise MissingInputError(f"{path}: no such file; run the sweep with --config first")
    with open(path) as f:
        return json.load(f)


def held_by_sweep(info: dict[str, Any]) -> bool:
    """The rule for a run directory's training claim (DIR/runs/RUN_ID/run.claim) met by a runner that holds the
    sweep's claim on that run (claims.try_claim, with its SLURM rule): the sweep's claim decides who trains the
    run, so any other holder of the directory's claim is an earlier attempt that is gone (a task killed on
    another host and requeued), not one to wait STALE_AFTER_S for."""
    return True


def train_run(workdir: str, run: dict[str, Any], mode: str, verbose: bool = False,
              max_retries: int = 0) -> tuple[dict[str, Any] | None, int]:
    """Trains (or resumes) one run in this process and records it. A run that raises is tried again
    (resuming from its checkpoints) up to `max_retries` times before it is recorded as failed; one that raises an
    environment failure (`environment_failure`: a module not installed) raises it at once, EnvironmentFailure,
    recording nothing: every executor (in process, a worker, a group, a SLURM task) stops the sweep there.

    Returns (the run's row, None when the run was preempted; and an exit code: 0 ok, 1 failed or diverged,
    3 preempted). The row is the one another process recorded where one came first.
    """
    try:
        from transformer.training.loop import train  # imported late: the caller sets up JAX first
    except ImportError as e:
        stop = environment_failure(e, run["run_id"])
        if stop is not None:
            raise stop from e
        raise
    t0 = time.time()
    config = run_config(workdir, run)
    seed_branch(workdir, run, verbose)
    for attempt in range(max_retries + 1):
        try:
            summary = train(config, os.path.join(workdir, "runs", run["run_id"]), verbose=verbose,
                            claim_dead=held_by_sweep)
            break
        except Exception as e:  # a failing run is retried, then recorded, and the sweep goes on
            if verbose:
                traceback.print_exc()
            stop = environment_failure(e, run["run_id"])
            if stop is not None:  # no retry fixes it, and every later run would fail the same way
                raise stop from e
            if attempt < max_retries:
                print(f"{run['run_id']} failed ({type(e).__name__}: {str(e)[:200]}); retry {attempt + 1} of "
                      f"{max_retries}", flush=True)
                continue
            row = result_row(run, None, FAILED, f"{type(e).__name__}: {e} (after {attempt + 1} attempts)",
                             time.time() - t0, mode, initial_loss(workdir, run))
            return _append(workdir, row), 1
    return record(workdir, run, summary, mode)


def seed_branch(workdir: str, run: dict[str, Any], verbose: bool = False) -> bool:
    """A branch (plan.py, sweep.branch) that has no checkpoint yet starts from a copy of its source run's
    decay-start checkpoint, where the two runs are still one; train() then resumes from it. Returns whether it
    did; a source without that checkpoint (failed, or removed) leaves the run to train from the start."""
    if not run.get("branch_from"):
        return False
    mine = os.path.join(workdir, "runs", run["run_id"], "checkpoints")
    if os.path.isdir(mine) and any(d.isdigit() for d in os.listdir(mine)):
        return False  # seeded before (or trained since): train() resumes from its own checkpoints
    step = str(run["start_step"])
    source = os.path.join(workdir, "runs", run["branch_from"], "checkpoints", step)
    if not os.path.exists(os.path.join(source, "commit_success.txt")):
        print(f"{run['run_id']}: no checkpoint {step} in {run['branch_from']} to branch from; training from step 0",
              flush=True)
        return False
    os.makedirs(mine, exist_ok=True)
    partial = os.path.join(mine, f"{step}.orbax-checkpoint-tmp-branch")  # orbax removes it if a kill interrupts
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    os.rename(partial, os.path.join(mine, step))
    if verbose:
        print(f"{run['run_id']}: branched from {run['branch_from']} at step {step} (its decay start)", flush=True)
    return True


def record(workdir: str, run: dict[str, Any], summary: dict[str, Any],
           mode: str) -> tuple[dict[str, Any] | None, int]:
    """Appends the results row of a run that trained to `summary`; (row or None, exit code) as train_run."""
    if summary["status"] == "preempted":
        return None, 3
    row = _append(workdir, _summary_row(workdir, run, summary, mode))
    return row, (0 if row["status"] == OK else 1)


def _summary_row(workdir: str, run: dict[str, Any], summary: dict[str, Any], mode: str) -> dict[str, Any]:
    return result_row(run, summary, OK if summary["status"] == OK else FAILED, summary.get("error"),
                      summary["wall_seconds"], mode, initial_loss(workdir, run))


def _append(workdir: str, row: dict[str, Any]) -> dict[str, Any]:
    """Records `row`; returns it, or the run's row another process recorded first."""
    if results.append_result(workdir, row):
        return row
    return next((canonical(r) for r in results.read_results(workdir) if r["run_id"] == row["run_id"]), row)


def finished_summary(workdir: str, run: dict[str, Any]) -> dict[str, Any] | None:
    """DIR/runs/RUN_ID/summary.json when it says the run finished (status ok), else None."""
    path = os.path.join(workdir, "runs", run["run_id"], "summary.json")
    try:
        with open(path) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("status") == OK else None


def recoverable(workdir: str, doc: dict[str, Any] | None = None,
                recorded: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The rows `recover` would append: one for each run of `doc` (default DIR/sweep.json) that finished
    (summary.json says ok) but has no results row (`recorded`: the run ids with one; default DIR/results.jsonl's),
    as it would have been recorded. Reads only."""
    if doc is None:
        if not os.path.exists(os.path.join(workdir, "sweep.json")):
            return []
        doc = load_sweep(workdir)
    have = set(recorded) if recorded is not None else {r["run_id"] for r in results.read_results(workdir)}
    return [_summary_row(workdir, run, summary, doc["mode"]) for run in doc["runs"]
            if run["run_id"] not in have and (summary := finished_summary(workdir, run)) is not None]


def recover(workdir: str, doc: dict[str, Any] | None = None) -> list[str]:
    """Records each `recoverable` run (its line lost: a torn or damaged line, a full disk, a runner killed between
    the two writes); returns their ids. Nothing is written when none is missing."""
    return [row["run_id"] for row in recoverable(workdir, doc) if results.append_result(workdir, row)]


def claim(workdir: str, doc: dict[str, Any], run: dict[str, Any]) -> claims.Claim | None:
    """This runner's claim on `run` (None: another live runner has it, or it got recorded meanwhile)."""
    held = claims.try_claim(workdir, run["run_id"], stale_after_s=doc["sweep"].get("claim_timeout_s", 600.0),
                            heartbeat_s=min(30.0, doc["sweep"].get("claim_timeout_s", 600.0) / 4))
    if held is not None and run["run_id"] in {r["run_id"] for r in results.read_results(workdir)}:
        held.release()  # finished by another runner between our listing and our claim
        return None
    return held
