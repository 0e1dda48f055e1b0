"""The sweep execution engine: runs a sweep's runs (in this process, in worker processes, or as one
worker for one run) and records each finished run in DIR/results.jsonl exactly once.

DIR/sweep.json holds the resolved sweep and every run's design numbers and full training config, so
a worker (`python -m experiments.sweep --workdir=DIR --run_index=I`, the unit of --parallel and of a
SLURM array task) needs nothing but DIR. Each run trains in DIR/runs/RUN_ID/; train() resumes an
interrupted run from its checkpoints and returns at once for a finished one.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from typing import Any, Container, Sequence

from transformer.design.spec import SweepSpec
from transformer.sweeps import claims, execute, next_stage, results, run_groups
from transformer.sweeps.execute import (  # one run's execution; re-exported: the runner's names since before
    CLAIMED_ELSEWHERE, SHAPE_KEYS, claim, load_sweep, record, result_row, run_config, seed_branch, train_run)
from transformer.sweeps.next_stage import (  # the one planning path; re-exported: the runner's names since before
    check_recorded, later_runs, plan_and_write, sweep_document, write_sweep)
from transformer.sweeps.progress import Progress

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The command line that trains one run of DIR as a worker process (--parallel, SLURM array tasks). A process
# boundary, not an import: the library depends on no command-line module.
WORKER_MODULE = "experiments.sweep"


def pending_runs(workdir: str, runs: Sequence[dict[str, Any]]) -> tuple[list[dict], dict[str, dict]]:
    """(runs without a results row, {run_id: row} of those with one, classified by execute.verdict)."""
    recorded = {r["run_id"]: r for r in execute.read_rows(workdir)}
    return [r for r in runs if r["run_id"] not in recorded], recorded


def _progress(doc: dict[str, Any], recorded: dict[str, dict], progress: Progress | None,
              later: Sequence[dict[str, Any]], parallel: int = 1) -> Progress:
    if progress is None:
        return Progress(doc["runs"], recorded, later, parallel)
    progress.stage(doc["runs"], recorded, later)
    return progress


def run_in_process(workdir: str, doc: dict[str, Any], verbose: bool = False, progress: Progress | None = None,
                   later: Sequence[dict[str, Any]] = ()) -> int:
    """Runs the pending runs one after another in this process (compiled programs and caches reused),
    or, with sweep.multirun, group by group. Runs claimed by another runner on the same DIR are left to it.
    `progress` (kept across stages) and `later` (the runs of the stages not designed yet, next_stage.later_runs):
    the ETA's."""
    todo, recorded = pending_runs(workdir, doc["runs"])
    progress = _progress(doc, recorded, progress, later)
    progress.event(f"{len(todo)} runs to go in {workdir}")
    if doc["sweep"].get("multirun"):
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


def branch_ready(run: dict[str, Any], running: Sequence[dict[str, Any]], recorded: Container[str]) -> bool:
    """A branch may start once its source run is recorded (or another runner holds it: then it waits)."""
    src = run.get("branch_from")
    if not src:
        return True
    if any(q["run_id"] == src for q in running):
        return False
    return src in recorded


def orphaned_sources(workdir: str, doc: dict[str, Any], todo: Sequence[dict[str, Any]],
                     running: Sequence[dict[str, Any]], recorded: Container[str]) -> list[dict[str, Any]]:
    """The unrecorded branch sources of `todo`'s branches that neither this runner (todo, running) nor a live
    runner elsewhere (claims.held) will train: a runner that held one died, or stopped without recording it.
    The caller takes them over (its worker's claim replaces the dead one), so their branches do not wait forever."""
    mine = {r["run_id"] for r in [*todo, *running]}
    by_id = {r["run_id"]: r for r in doc["runs"]}
    stale = doc["sweep"].get("claim_timeout_s", 600.0)
    out = []
    for src in dict.fromkeys(r["branch_from"] for r in todo if r.get("branch_from")):
        if src not in recorded and src not in mine and not claims.held(workdir, src, stale):
            out.append(by_id[src])
    return out


def ready_to_submit(workdir: str, doc: dict[str, Any], recorded: Container[str] | None = None) -> list[int]:
    """Indices of the runs without a results row whose branch source, if any, is recorded: what a SLURM
    submission of `doc` trains now (the command and its dry run). `recorded`: the run ids with a row (default:
    DIR/results.jsonl's; the dry run's next_stage rows)."""
    if recorded is None:
        todo, recorded = pending_runs(workdir, doc["runs"])
    else:
        todo = [r for r in doc["runs"] if r["run_id"] not in recorded]
    return [r["index"] for r in todo if not r.get("branch_from") or r["branch_from"] in recorded]


def run_parallel(workdir: str, doc: dict[str, Any], parallel: int, progress: Progress | None = None,
                 later: Sequence[dict[str, Any]] = ()) -> int:
    """Runs the pending runs in `parallel` worker processes; each records its own result (progress and
    later as run_in_process's)."""
    todo, recorded = pending_runs(workdir, doc["runs"])
    index = {r["run_id"]: i for i, r in enumerate(doc["runs"])}
    progress = _progress(doc, recorded, progress, later, parallel)
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
    cache = results.Cache(workdir)  # one read of results.jsonl per change, not per pending run and poll
    try:
        while (todo and stop["signal"] is None) or procs:
            recorded = cache.rows()
            running = [q for _, q in procs.values()]
            for src in orphaned_sources(workdir, doc, todo, running, recorded):
                progress.event(f"take over {src['run_id']}: the runner that claimed it is gone, and runs branch "
                               "from it")
                todo.insert(0, src)
            ready = [r for r in todo if branch_ready(r, running, recorded)]
            for slot in range(parallel):
                if slot in procs or not ready or stop["signal"] is not None:
                    continue
                run = ready.pop(0)
                todo.remove(run)
                run_dir = os.path.join(workdir, "runs", run["run_id"])
                os.makedirs(run_dir, exist_ok=True)
                # a run that trains alone (nothing else running or ready: a stage's last run, the validation
                # run) gets every core; otherwise each worker gets its share
                alone = not procs and not ready
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
                row = cache.rows().get(run["run_id"])
                if row is None and p.returncode == CLAIMED_ELSEWHERE:
                    progress.finished(run, None, "(claimed by another runner)")
                    continue
                if row is None and p.returncode != 3:  # the worker died before recording anything
                    row = record_dead_worker(workdir, doc, run, f"worker exited with code {p.returncode}; see "
                                             f"{os.path.join(workdir, 'runs', run['run_id'], 'worker.log')}")
                progress.finished(run, row, "(preempted: rerun the command to resume)" if p.returncode == 3 else "")
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return 3 if stop["signal"] is not None else 0


def record_dead_worker(workdir: str, doc: dict[str, Any], run: dict[str, Any], error: str) -> dict[str, Any]:
    """The row of a run whose worker (process or SLURM task) ended without recording it: its own result when its
    run directory says it finished (execute.recover: killed between its summary and its row), else a failed row
    with `error`; the claim the worker left is removed. Returns the run's row (another's, if one came first)."""
    if not execute.recover(workdir, {**doc, "runs": [run]}):
        results.append_result(workdir, result_row(run, None, execute.FAILED, error, 0.0, doc["mode"]))
    claims.release_recorded(workdir, {run["run_id"]}, doc["sweep"].get("claim_timeout_s", 600.0))
    return next(r for r in execute.read_rows(workdir) if r["run_id"] == run["run_id"])


def all_recorded(workdir: str, doc: dict[str, Any]) -> bool:
    return not pending_runs(workdir, doc["runs"])[0]


OTHER_RUNNERS = 5  # run_sweep: runs of this stage are left to other runners on the same DIR
STOPPED = 6        # run_sweep: `stages` stages trained; the rest is left to the next command


def run_sweep(workdir: str, config: Any, parallel: int = 1, verbose: bool = False, *, retry_failed: bool = False,
              stages: int | None = None) -> tuple[int, dict[str, Any]]:
    """Trains the sweep stage by stage: next_stage (design from the results so far, predict where the plan waits
    for the prediction, write DIR/sweep.json), train its todo, again until every stage is designed and recorded,
    or, with `stages`, until that many stages have trained and more is left to do. `retry_failed`: the failed runs
    train again. Returns (0: done, 3: preempted, OTHER_RUNNERS, STOPPED; the last sweep document: with STOPPED,
    the next stage's as the dry run designs it, nothing of it written)."""
    from transformer.design import plan
    from transformer.sweeps import outcome

    spec = SweepSpec.of(config)
    preview, progress, trained = plan.design(spec, preview=True), None, 0  # the whole sweep from the priors: ETA
    while True:
        if stages is not None and trained >= stages:  # stop where anything is left to do (nothing written)
            peek = next_stage.next_stage(workdir, spec, write=False)
            if peek.todo or peek.plan.waiting:
                return STOPPED, peek.doc
        ns = next_stage.next_stage(workdir, spec, write=True, retry_failed=retry_failed)
        if retry_failed:
            print(f"retrying {len(ns.retried)} failed runs", flush=True)
            retry_failed = False
        if ns.prediction is not None:
            outcome.announce_prediction(workdir, ns.prediction)
        doc = ns.doc
        if not ns.todo:
            if ns.plan.waiting is None:
                print(f"0 runs to go: all {len(doc['runs'])} runs of {workdir} are recorded", flush=True)
                return 0, doc
            raise RuntimeError(f"the sweep plan waits for {ns.plan.waiting} but has no run to train (a bug)")
        if ns.plan.waiting:
            print(f"stage: {len(ns.todo)} runs, then {ns.plan.waiting} decides the next stage", flush=True)
        later = later_runs(preview, doc)
        progress = progress or Progress(doc["runs"], {}, later, parallel)  # kept across stages
        code = (run_parallel(workdir, doc, parallel, progress, later) if parallel > 1
                else run_in_process(workdir, doc, verbose, progress, later))
        trained += 1
        if code:
            return code, doc
        if pending_runs(workdir, ns.todo)[0]:
            return OTHER_RUNNERS, doc
