"""The sweep execution engine: runs a sweep's runs (in this process, in worker processes, or as one
worker for one run) and records each finished run in DIR/results.jsonl exactly once.

DIR/sweep.json holds the resolved sweep and every run's design numbers and full training config, so
a worker (`python -m experiments.sweep --workdir=DIR --run_index=I`, the unit of --parallel and of a
SLURM array task) needs nothing but DIR. Each run trains in DIR/runs/RUN_ID/; train() resumes an
interrupted run from its checkpoints and returns at once for a finished one.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
import warnings
from typing import Any, Sequence

import ml_collections

from transformer import files
from transformer.models.config import ConfigError, MissingInputError
from transformer.sweeps import claims, results
from transformer.sweeps.progress import Progress

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The command line that trains one run of DIR as a worker process (--parallel, SLURM array tasks). A process
# boundary, not an import: the library depends on no command-line module.
WORKER_MODULE = "experiments.sweep"
SHAPE_KEYS = ("d_model", "num_layers", "num_heads", "head_dim", "d_ff")


def sweep_document(config: ml_collections.ConfigDict, p: Any) -> dict[str, Any]:
    """What DIR/sweep.json holds: the resolved sweep section and base, the plan's notes and what it waits for,
    and every run designed so far (plan.design) with its time estimate."""
    from transformer.sweeps.plan import estimate_seconds

    estimates = [estimate_seconds(r, config.sweep) for r in p.runs]
    return {"name": config.sweep.name, "mode": config.sweep.mode,
            "sweep": json.loads(json.dumps(config.sweep.to_dict())),
            "base": json.loads(json.dumps(config.base.to_dict())), "notes": list(p.notes),
            "waiting": p.waiting, "lr_fit": p.lr_fit, "estimated_seconds": float(sum(estimates)),
            "runs": [{**r.describe(), "estimated_seconds": e, "config": json.loads(json.dumps(r.config.to_dict()))}
                     for r, e in zip(p.runs, estimates)]}


def write_sweep(workdir: str, doc: dict[str, Any]) -> None:
    """Writes DIR/sweep.json. Its runs only grow (stage by stage, in order, so a worker's --run_index stays
    valid); a DIR holding a sweep with other runs is an error (use a new DIR)."""
    os.makedirs(os.path.join(workdir, "runs"), exist_ok=True)
    path = os.path.join(workdir, "sweep.json")
    if os.path.exists(path):
        old_doc = load_sweep(workdir)
        if old_doc.get("data_identity"):  # the data its runs trained on: other data is refused, naming the change
            from transformer.data import identity
            identity.check_same(f"the sweep in {workdir}", old_doc["data_identity"], doc.get("data_identity"))
            doc["data_identity"] = doc.get("data_identity") or old_doc["data_identity"]
        old_ids = [r["run_id"] for r in old_doc["runs"]]
        new_ids = [r["run_id"] for r in doc["runs"]]
        if new_ids[:len(old_ids)] != old_ids and set(new_ids) != set(old_ids):
            differ = sorted(set(old_ids) ^ set(new_ids)) or [i for i, j in zip(old_ids, new_ids) if i != j]
            raise ConfigError(f"--workdir={workdir} holds a different sweep ({len(differ)} runs differ, "
                              f"e.g. {differ[0]}); use a new --workdir, or the same settings to resume")
    files.write_json(path, doc, indent=1)


def load_sweep(workdir: str) -> dict[str, Any]:
    path = os.path.join(workdir, "sweep.json")
    if not os.path.exists(path):
        raise MissingInputError(f"{path}: no such file; run the sweep with --config first")
    with open(path) as f:
        return json.load(f)


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
        row.update({k: s[k] for k in ("params", "params_non_embedding", "tokens", "flops") if k in s})
    return row


CLAIMED_ELSEWHERE = 4  # exit code of a worker whose run another runner holds


def run_config(workdir: str, run: dict[str, Any]) -> ml_collections.ConfigDict:
    """A run's training config from sweep.json; its W&B runs are grouped by sweep: logging.wandb_group, when
    unset, is the sweep directory's name (logging is not part of the run id)."""
    config = ml_collections.ConfigDict(run["config"])
    if "logging" in config and not config.logging.get("wandb_group"):
        config.logging.wandb_group = os.path.basename(os.path.normpath(workdir))
    return config


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
        config.data.identity = recorded
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


def pending_runs(workdir: str, runs: Sequence[dict[str, Any]]) -> tuple[list[dict], dict[str, dict]]:
    """(runs without a results row, {run_id: row} of those with one)."""
    recorded = {r["run_id"]: r for r in results.read_results(workdir)}
    return [r for r in runs if r["run_id"] not in recorded], recorded


def claim(workdir: str, doc: dict[str, Any], run: dict[str, Any]) -> claims.Claim | None:
    """This runner's claim on `run` (None: another live runner has it, or it got recorded meanwhile)."""
    held = claims.try_claim(workdir, run["run_id"], stale_after_s=doc["sweep"].get("claim_timeout_s", 600.0),
                            heartbeat_s=min(30.0, doc["sweep"].get("claim_timeout_s", 600.0) / 4))
    if held is not None and run["run_id"] in {r["run_id"] for r in results.read_results(workdir)}:
        held.release()  # finished by another runner between our listing and our claim
        return None
    return held


def run_in_process(workdir: str, doc: dict[str, Any], verbose: bool = False) -> int:
    """Runs the pending runs one after another in this process (compiled programs and caches reused),
    or, with sweep.multirun, group by group. Runs claimed by another runner on the same DIR are left to it."""
    todo, recorded = pending_runs(workdir, doc["runs"])
    progress = Progress(doc["runs"], recorded)
    progress.event(f"{len(todo)} runs to go in {workdir}")
    if doc["sweep"].get("multirun"):
        from transformer.sweeps import run_groups

        for group in run_groups.groups(workdir, todo):
            if run_groups.train_group_runs(workdir, doc, group, progress, verbose) == 3:
                return 3
        return 0
    for run in todo:
        held = claim(workdir, doc, run)
        if held is None:
            progress.event(f"skip {run['run_id']}: claimed by another runner")
            continue
        with held:
            progress.started(run)
            row, code = train_run(workdir, run, doc["mode"], verbose, doc["sweep"].get("max_retries", 0))
        progress.finished(run, row, "(preempted: rerun the command to resume)" if code == 3 else "")
        if code == 3:
            return 3
    return 0


def _gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")]) if out.returncode == 0 else 0


def worker_env(slot: int, parallel: int) -> tuple[dict[str, str], list[int] | None]:
    """(environment, CPU affinity) of worker `slot` of `parallel`: one GPU each where there are GPUs,
    else an equal share of the CPU cores (XLA sizes its thread pool from the affinity)."""
    env = dict(os.environ)
    gpus = _gpu_count()
    if gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(gpus)))).split(",")
        env["CUDA_VISIBLE_DEVICES"] = visible[slot % gpus].strip()
        if parallel > gpus:  # several workers share a GPU: no up-front memory grab
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        return env, None
    cpus = sorted(os.sched_getaffinity(0))
    if parallel > len(cpus):
        return env, None
    share = len(cpus) // parallel
    mine = cpus[slot * share:(slot + 1) * share]
    env["OMP_NUM_THREADS"] = str(len(mine))
    return env, mine


def branch_ready(workdir: str, run: dict[str, Any], running: Sequence[dict[str, Any]]) -> bool:
    """A branch may start once its source run is recorded (or another runner holds it: then it waits)."""
    src = run.get("branch_from")
    if not src:
        return True
    if any(q["run_id"] == src for q in running):
        return False
    return src in {r["run_id"] for r in results.read_results(workdir)}


def ready_to_submit(workdir: str, doc: dict[str, Any]) -> list[int]:
    """Indices of the runs without a results row whose branch source, if any, is recorded: what a SLURM
    submission of `doc` trains now (the command and its dry run)."""
    todo, recorded = pending_runs(workdir, doc["runs"])
    return [r["index"] for r in todo if not r.get("branch_from") or r["branch_from"] in recorded]


def run_parallel(workdir: str, doc: dict[str, Any], parallel: int) -> int:
    """Runs the pending runs in `parallel` worker processes; each records its own result."""
    todo, recorded = pending_runs(workdir, doc["runs"])
    index = {r["run_id"]: i for i, r in enumerate(doc["runs"])}
    progress = Progress(doc["runs"], recorded)
    progress.event(f"{len(todo)} runs to go in {workdir}, {parallel} workers")
    procs: dict[int, tuple[subprocess.Popen, dict[str, Any]]] = {}  # slot -> (process, run)
    stop = {"signal": None}
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum, _frame):
        stop["signal"] = signum
        for p, _ in procs.values():
            p.send_signal(signal.SIGTERM)  # workers checkpoint and exit with code 3

    for s in previous:
        signal.signal(s, on_signal)
    try:
        while (todo and stop["signal"] is None) or procs:
            for slot in range(parallel):
                ready = [r for r in todo if branch_ready(workdir, r, [q for _, q in procs.values()])]
                if slot in procs or not ready or stop["signal"] is not None:
                    continue
                run = ready[0]
                todo.remove(run)
                run_dir = os.path.join(workdir, "runs", run["run_id"])
                os.makedirs(run_dir, exist_ok=True)
                # a run that trains alone (nothing else running or ready: a stage's last run, the validation
                # run) gets every core; otherwise each worker gets its share
                alone = not procs and len(ready) == 1
                env, cpus = worker_env(0, 1) if alone else worker_env(slot, parallel)
                log = open(os.path.join(run_dir, "worker.log"), "a")
                cmd = [sys.executable, "-m", WORKER_MODULE, f"--workdir={workdir}",
                       f"--run_index={index[run['run_id']]}"]
                with warnings.catch_warnings():  # JAX warns at any fork; the child execs at once (no preexec_fn)
                    warnings.filterwarnings("ignore", message="os.fork")
                    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
                if cpus:  # before the worker's XLA reads its affinity, seconds later, after Python's imports
                    os.sched_setaffinity(proc.pid, cpus)
                procs[slot] = (proc, run)
                log.close()
                progress.started(run)
            time.sleep(0.2)
            for slot, (p, run) in list(procs.items()):
                if p.poll() is None:
                    continue
                del procs[slot]
                rows = {r["run_id"]: r for r in results.read_results(workdir)}
                row = rows.get(run["run_id"])
                if row is None and p.returncode == CLAIMED_ELSEWHERE:
                    progress.finished(run, None, "(claimed by another runner)")
                    continue
                if row is None and p.returncode != 3:  # the worker died before recording anything
                    row = result_row(run, None, "failed", f"worker exited with code {p.returncode}; see "
                                     f"{os.path.join(workdir, 'runs', run['run_id'], 'worker.log')}", 0.0, doc["mode"])
                    if not results.append_result(workdir, row):  # recorded meanwhile after all
                        row = {r["run_id"]: r for r in results.read_results(workdir)}[run["run_id"]]
                progress.finished(run, row, "(preempted: rerun the command to resume)" if p.returncode == 3 else "")
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return 3 if stop["signal"] is not None else 0


def all_recorded(workdir: str, doc: dict[str, Any]) -> bool:
    return not pending_runs(workdir, doc["runs"])[0]




OTHER_RUNNERS = 5  # run_sweep: runs of this stage are left to other runners on the same DIR


def plan_and_write(workdir: str, config: ml_collections.ConfigDict) -> tuple[Any, dict[str, Any]]:
    """The plan from DIR's recorded results (plan.design) and its DIR/sweep.json."""
    from transformer.data import identity
    from transformer.sweeps import outcome, plan

    rows = {r["run_id"]: r for r in results.read_results(workdir)}
    p = plan.design(config, rows, outcome.load_prediction(workdir))
    doc = {**sweep_document(config, p), "data_identity": identity.peek(config.base.data)}  # None until built
    write_sweep(workdir, doc)
    return p, doc


def run_sweep(workdir: str, config: ml_collections.ConfigDict, parallel: int = 1,
              verbose: bool = False) -> tuple[int, dict[str, Any]]:
    """Trains the sweep stage by stage (plan.py): design from the results so far, train what is pending, again
    until every stage is designed and recorded; the prediction is written (outcome.predict) before the
    validation run is designed. Returns (0: done, 3: preempted, OTHER_RUNNERS; the last sweep document)."""
    from transformer.sweeps import outcome

    while True:
        p, doc = plan_and_write(workdir, config)
        if p.waiting == "prediction":
            pred = outcome.predict(workdir, doc)
            if pred["params"] is None:
                print(f"warning: {pred['note']}; see {workdir}/fit/fit.json", flush=True)
                continue
            ci = pred.get("loss_ci95") or [math.nan, math.nan]
            print(f"prediction written to {workdir}/fit/predictions.json before anything trains at "
                  f"{pred['flops']:.3g} FLOPs: N_opt {pred['params']:.3g} ({pred['convention']}), D_opt "
                  f"{pred['tokens']:.3g}, loss {pred['loss']:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]", flush=True)
            continue
        todo, _ = pending_runs(workdir, doc["runs"])
        if not todo:
            if p.waiting is None:
                print(f"0 runs to go: all {len(doc['runs'])} runs of {workdir} are recorded", flush=True)
                return 0, doc
            raise RuntimeError(f"the sweep plan waits for {p.waiting} but has no run to train (a bug)")
        if p.waiting:
            print(f"stage: {len(todo)} runs, then {p.waiting} decides the next stage", flush=True)
        code = run_parallel(workdir, doc, parallel) if parallel > 1 else run_in_process(workdir, doc, verbose)
        if code:
            return code, doc
        if pending_runs(workdir, todo)[0]:
            return OTHER_RUNNERS, doc
