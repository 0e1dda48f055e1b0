"""One run of a sweep, in this process: its training config from DIR/sweep.json, its claim, the branch seed
(a copy of its source run's decay-start checkpoint), training with retries, and its DIR/results.jsonl row.

Used by the runner (transformer/sweeps/runner.py: one run after another, worker processes) and by run groups
(transformer/sweeps/run_groups.py: sweep.multirun); it imports neither, so the dependency runs one way.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import time
import traceback
from typing import Any

from transformer.spec import MissingInputError
from transformer.sweeps import claims, results

SHAPE_KEYS = ("d_model", "num_layers", "num_heads", "head_dim", "d_ff")


def result_row(run: dict[str, Any], summary: dict[str, Any] | None, status: str, error: str | None,
               wall_seconds: float, mode: str) -> dict[str, Any]:
    """One results.jsonl row: the run's design numbers and shape, overlaid with what training measured."""
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
               compile_seconds=s.get("compile_seconds"), device=s.get("device"))
    if status == "ok":  # measured values (equal to the design's when the run reached its last step)
        row.update({k: s[k] for k in ("params", "params_non_embedding", "params_unpadded", "vocab_size_unpadded",
                                      "tokens", "flops") if k in s})
    return row


CLAIMED_ELSEWHERE = 4  # exit code of a worker whose run another runner holds


def run_config(workdir: str, run: dict[str, Any]) -> dict[str, Any]:
    """A run's training config from sweep.json (a plain nested dict: training.resolve reads it by item access);
    its W&B runs are grouped by sweep: logging.wandb_group, when unset, is the sweep directory's name (logging is
    not part of the run id)."""
    config = copy.deepcopy(run["config"])
    if "logging" in config and not config["logging"].get("wandb_group"):
        config["logging"]["wandb_group"] = os.path.basename(os.path.normpath(workdir))
    return config


def load_sweep(workdir: str) -> dict[str, Any]:
    path = os.path.join(workdir, "sweep.json")
    if not os.path.exists(path):
        raise MissingInputError(f"{path}: no such file; run the sweep with --config first")
    with open(path) as f:
        return json.load(f)


def train_run(workdir: str, run: dict[str, Any], mode: str, verbose: bool = False,
              max_retries: int = 0) -> tuple[dict[str, Any] | None, int]:
    """Trains (or resumes) one run in this process and records it. A run that raises is tried again
    (resuming from its checkpoints) up to `max_retries` times before it is recorded as failed.

    Returns (the row, or None when the run was preempted or another process recorded it first; and an
    exit code: 0 ok, 1 failed, 3 preempted).
    """
    from transformer.training.loop import train  # imported late: the caller sets up JAX first

    t0 = time.time()
    config = run_config(workdir, run)
    recorded = load_sweep(workdir).get("data_identity")
    if recorded:  # resolve refuses the run unless its data is the sweep's (data/identity.py)
        config["data"]["identity"] = recorded
    seed_branch(workdir, run, verbose)
    for attempt in range(max_retries + 1):
        try:
            summary = train(config, os.path.join(workdir, "runs", run["run_id"]), verbose=verbose)
            break
        except Exception as e:  # a failing run is retried, then recorded, and the sweep goes on
            if verbose:
                traceback.print_exc()
            if attempt < max_retries:
                print(f"{run['run_id']} failed ({type(e).__name__}: {str(e)[:200]}); retry {attempt + 1} of "
                      f"{max_retries}", flush=True)
                continue
            row = result_row(run, None, "failed", f"{type(e).__name__}: {e} (after {attempt + 1} attempts)",
                             time.time() - t0, mode)
            return (row if results.append_result(workdir, row) else None), 1
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
    status = "ok" if summary["status"] == "ok" else "failed"
    row = result_row(run, summary, status, summary.get("error"), summary["wall_seconds"], mode)
    return (row if results.append_result(workdir, row) else None), (0 if status == "ok" else 1)


def claim(workdir: str, doc: dict[str, Any], run: dict[str, Any]) -> claims.Claim | None:
    """This runner's claim on `run` (None: another live runner has it, or it got recorded meanwhile)."""
    held = claims.try_claim(workdir, run["run_id"], stale_after_s=doc["sweep"].get("claim_timeout_s", 600.0),
                            heartbeat_s=min(30.0, doc["sweep"].get("claim_timeout_s", 600.0) / 4))
    if held is not None and run["run_id"] in {r["run_id"] for r in results.read_results(workdir)}:
        held.release()  # finished by another runner between our listing and our claim
        return None
    return held
