"""The sweep execution engine: runs a sweep's runs (in this process, in worker processes, or as one
worker for one run) and records each finished run in DIR/results.jsonl exactly once.

DIR/sweep.json holds the resolved sweep and every run's design numbers and full training config, so
a worker (`python -m experiments.sweep --workdir=DIR --run_index=I`, the unit of --parallel and of a
SLURM array task) needs nothing but DIR. Each run trains in DIR/runs/RUN_ID/; train() resumes an
interrupted run from its checkpoints and returns at once for a finished one.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import warnings
from typing import Any, Callable, Container, Mapping, Sequence

from transformer.design.estimate import Schedule
from transformer.design.spec import SweepSpec
from transformer.sweeps import claims, execute, next_stage, packing, results, run_groups
from transformer.sweeps.execute import (  # one run's execution; re-exported: the runner's names since before
    CLAIMED_ELSEWHERE, SHAPE_KEYS, claim, load_sweep, record, result_row, run_config, seed_branch, train_run)
from transformer.sweeps.next_stage import (  # the one planning path; re-exported: the runner's names since before
    check_recorded, later_runs, plan_and_write, sweep_document, write_sweep)
from transformer.sweeps.progress import Progress, unit_key, units_of

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
        return Progress(doc["runs"], recorded, later, parallel, settings=doc["sweep"])
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


def units(workdir: str, doc: dict[str, Any], runs: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """What one worker trains at a time: a run, or with sweep.multirun a group of runs that differ only in learning
    rate and seed (run_groups.groups), in the order of their first run."""
    if doc["sweep"].get("multirun"):
        return run_groups.groups(workdir, runs)
    return [[r] for r in runs]


def worker_slots(doc: dict[str, Any], todo: Sequence[Sequence[dict[str, Any]]], parallel: int,
                 gpus: Sequence[packing.Gpu] | None = None, cores: int | None = None) -> list[packing.Slot]:
    """The worker slots for the units `todo` (packing.place: `parallel` workers, or 0: as many per GPU as
    sweep.workers_per_device or the units' memory estimates allow) on `gpus` (default: packing.visible_gpus()) with
    `cores` CPU cores (default: this process's)."""
    gpus = packing.visible_gpus() if gpus is None else gpus
    sizes = [packing.unit_memory([r["config"] for r in u]) for u in todo] if gpus else []
    return packing.place(parallel, gpus, sizes, int(doc["sweep"].get("workers_per_device") or 0), cores)


def check_slots(config: Any, parallel: int) -> None:
    """Refuses (ConfigError, before anything trains) a `parallel` or sweep.workers_per_device that gives a worker
    less of its GPU than the memory estimate of a run (or group) the sweep designs (its priors' preview)."""
    from transformer.design import plan

    spec = SweepSpec.of(config)
    gpus = packing.visible_gpus()
    if not gpus or parallel == 1:
        return
    runs = [{"config": r.config} for r in plan.design(spec, preview=True,
                                                      schedule=schedule(spec.settings(), parallel)[0]).runs]
    units = units_of(runs, unit_key(spec.settings()))
    packing.place(parallel, gpus, [packing.unit_memory([r["config"] for r in u]) for u in units],
                  spec.workers_per_device)


def slot_planner(settings: Mapping[str, Any], parallel: int,
                 assume: bool = False) -> tuple[Callable[[list], list[packing.Slot]], bool]:
    """(units → their worker_slots, whether the GPU is one sweep.estimate_device_memory_gb assumes): what the ETA
    and the estimate pack each stage on. `settings`: the sweep's (sweep.json's "sweep"). `assume` (the dry run
    where the sweep chooses, --parallel=0): where no GPU is visible, one GPU of that memory, shared as --parallel=0
    would share it (none where it is 0)."""
    gpus, assumed, cores = packing.visible_gpus(), False, None
    gb = float(settings.get("estimate_device_memory_gb") or 0.0)
    if assume and not gpus and gb:  # another machine's GPU: not limited by this one's cores
        gpus, parallel, assumed = [packing.Gpu("(assumed)", int(gb * 1e9))], 0, True
        cores = 2 * packing.MAX_AUTO_WORKERS
    doc = {"sweep": settings}
    known: dict[tuple[str, ...], list[packing.Slot]] = {}

    def slots_for(units: list) -> list[packing.Slot]:
        ids = tuple(r["run_id"] for u in units for r in u)
        if ids not in known:
            known[ids] = worker_slots(doc, units, parallel, gpus, cores)
        return known[ids]

    return slots_for, assumed


def schedule(settings: Mapping[str, Any], parallel: int,
             assume: bool = False) -> tuple[Schedule, Callable[[list], list[packing.Slot]], bool]:
    """(how the sweep's runs will train, for the estimate sweep.max_hours bounds and the ETA: design/estimate's
    Schedule, each stage's units on the slots `slot_planner` gives them; its slots_for; whether the GPU is
    assumed). Without a GPU and with --parallel=1: one after another in this process."""
    slots_for, assumed = slot_planner(settings, parallel, assume)
    key = unit_key(settings)

    def pack(runs: Sequence[Mapping[str, Any]]) -> tuple[list[list[Mapping[str, Any]]], int, int]:
        units = units_of(runs, key)
        slots = slots_for(units)
        return units, len(slots), packing.devices(slots)

    return Schedule(pack, _how(settings, parallel, assumed)), slots_for, assumed


def _how(settings: Mapping[str, Any], parallel: int, assumed: bool) -> str:
    """The words for how the runs will train, in the estimate line and the sweep.max_hours refusal."""
    if assumed:
        return (f"packed on an assumed {settings['estimate_device_memory_gb']:g} GB GPU, stage by stage "
                f"(--parallel=0; sweep.estimate_device_memory_gb: no GPU is visible here)")
    if parallel == 1:
        return Schedule().how
    gpus = packing.visible_gpus()
    if not gpus:
        return f"in {parallel} worker processes, stage by stage"
    return (f"packed on GPU {', '.join(g.name for g in gpus)}, stage by stage ("
            + ("--parallel=0: as many workers as fit" if parallel == 0 else f"--parallel={parallel}") + ")")


worker_env = packing.worker_env  # (slot, alone) -> (environment, CPU affinity); tests replace it


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
    """Runs the pending runs in worker processes, each training one unit (`units`: a run, or a sweep.multirun
    group) in a slot (`worker_slots`: `parallel` workers; 0: as many per GPU as fit) and recording its own result
    (progress and later as run_in_process's). A unit that ran out of device memory beside other workers on its
    GPU trains again alone on it (its failed row removed). A worker stopped by an environment failure (a module not
    installed: execute.ENVIRONMENT_EXIT) stops the others (they checkpoint) and raises its EnvironmentFailure, its
    run not recorded."""
    todo_runs, recorded = pending_runs(workdir, doc["runs"])
    todo = units(workdir, doc, todo_runs)
    slots = worker_slots(doc, todo, parallel)
    index = {r["run_id"]: i for i, r in enumerate(doc["runs"])}
    progress = _progress(doc, recorded, progress, later, len(slots))
    progress.workers(len(slots), packing.devices(slots))
    progress.event(f"{len(todo_runs)} runs to go in {workdir}, {packing.describe(slots)}")
    procs: dict[int, tuple[subprocess.Popen, list[dict[str, Any]], packing.Slot]] = {}  # slot -> (process, unit, slot)
    alone: set[str] = set()  # run ids that train alone on a GPU (they ran out of memory beside others)
    stop: dict[str, Any] = {"signal": None, "failure": None}  # a signal, or a worker's EnvironmentFailure
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum, _frame):
        stop["signal"] = signum
        for p, _, _ in procs.values():
            p.send_signal(signal.SIGTERM)  # workers checkpoint and exit with code 3

    for s in previous:
        signal.signal(s, on_signal)
    cache = results.Cache(workdir)  # one read of results.jsonl per change, not per pending run and poll
    try:
        while (todo and stop["signal"] is None and stop["failure"] is None) or procs:
            recorded = cache.rows()
            running = [q for _, u, _ in procs.values() for q in u]
            for src in orphaned_sources(workdir, doc, [r for u in todo for r in u], running, recorded):
                progress.event(f"take over {src['run_id']}: the runner that claimed it is gone, and runs branch "
                               "from it")
                todo.insert(0, [src])
            ready = [u for u in todo if all(branch_ready(r, running, recorded) for r in u)]
            for slot in slots:
                if slot.index in procs or not ready or stop["signal"] is not None or stop["failure"] is not None:
                    continue
                unit = ready[0]
                on_gpu = [u for _, u, q in procs.values() if slot.gpu is not None and q.gpu == slot.gpu]
                if unit[0]["run_id"] in alone:  # waits for a free GPU; nothing else starts before it
                    if on_gpu:
                        continue
                    slot = dataclasses.replace(slot, sharing=1)
                elif any(u[0]["run_id"] in alone for u in on_gpu):
                    continue  # its GPU is held by a unit training alone
                ready.pop(0)
                todo.remove(unit)
                procs[slot.index] = (_start_worker(workdir, unit, index, slot, not procs and not ready), unit, slot)
                for run in unit:
                    progress.started(run)
            time.sleep(0.2)
            for i, (p, unit, slot) in list(procs.items()):
                if p.poll() is None:
                    continue
                del procs[i]
                if p.returncode == execute.ENVIRONMENT_EXIT or (stop["failure"] is not None
                                                                 and p.returncode == -signal.SIGTERM):
                    if stop["failure"] is None:  # a module not installed: every run would fail so
                        log = os.path.join(workdir, "runs", unit[0]["run_id"], "worker.log")
                        stop["failure"] = execute.logged_environment_failure(log, unit[0]["run_id"])
                        for q, _, _ in procs.values():
                            q.send_signal(signal.SIGTERM)  # the others checkpoint (exit 3) or, starting, end
                    for run in unit:  # not recorded: the command rerun after the fix trains it
                        progress.finished(run, None, "(stopped: the sweep's environment lacks what it needs)")
                    continue
                again = _finish_unit(workdir, doc, unit, slot, p.returncode, cache, progress, alone)
                if again:
                    alone.update(r["run_id"] for r in again)
                    todo.insert(0, again)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if stop["failure"] is not None:
        raise stop["failure"]
    return 3 if stop["signal"] is not None else 0


def _start_worker(workdir: str, unit: Sequence[dict[str, Any]], index: dict[str, int], slot: packing.Slot,
                  alone: bool) -> subprocess.Popen:
    """The worker process that trains `unit` (`--run_index=I` or `=I,J,...` for a group) in `slot`, its output in
    its first run's DIR/runs/RUN_ID/worker.log. `alone`: nothing else is running or ready (on the CPU: every core)."""
    run_dir = os.path.join(workdir, "runs", unit[0]["run_id"])
    os.makedirs(run_dir, exist_ok=True)
    env, cpus = worker_env(slot, alone)
    cmd = [sys.executable, "-m", WORKER_MODULE, f"--workdir={workdir}",
           f"--run_index={','.join(str(index[r['run_id']]) for r in unit)}"]
    with open(os.path.join(run_dir, "worker.log"), "a") as log:
        with warnings.catch_warnings():  # JAX warns at any fork; the child execs at once (no preexec_fn)
            warnings.filterwarnings("ignore", message="os.fork")
            proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if cpus:  # before the worker's XLA reads its affinity, seconds later, after Python's imports
        os.sched_setaffinity(proc.pid, cpus)
    return proc


def _finish_unit(workdir: str, doc: dict[str, Any], unit: Sequence[dict[str, Any]], slot: packing.Slot,
                 returncode: int, cache: results.Cache, progress: Progress, alone: set[str]) -> list[dict[str, Any]]:
    """After a worker exited: each run of its unit as recorded (a row the worker did not write: claimed by another
    runner, preempted, or the worker died: a failed row). Returns the runs to train again alone on their GPU: those
    that ran out of memory beside other workers (their rows removed)."""
    rows, again = cache.rows(), []
    stale = doc["sweep"].get("claim_timeout_s", 600.0)
    for run in unit:
        row = rows.get(run["run_id"])
        if row is None and (returncode == CLAIMED_ELSEWHERE or (len(unit) > 1 and returncode != 3
                                                                and claims.held(workdir, run["run_id"], stale))):
            progress.finished(run, None, "(claimed by another runner)")
            continue
        if row is None and returncode != 3:  # the worker died before recording anything
            row = record_dead_worker(workdir, doc, run, f"worker exited with code {returncode}; see "
                                     f"{os.path.join(workdir, 'runs', unit[0]['run_id'], 'worker.log')}")
        if slot.gpu is not None and slot.sharing > 1 and packing.out_of_memory(row) and run["run_id"] not in alone:
            again.append(run)
            continue
        progress.finished(run, row, "(preempted: rerun the command to resume)" if returncode == 3 else "")
    if again:
        ids = {r["run_id"] for r in again}
        results.remove_rows(workdir, lambda r: r["run_id"] in ids)
        for run in again:
            progress.finished(run, None, f"(out of memory beside {slot.sharing - 1} other workers on GPU "
                                         f"{slot.gpu.name}: it trains again alone on it)")
    return again


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
    or, with `stages`, until that many stages have trained and more is left to do. `parallel`: 1, in this process;
    K > 1, K worker processes; 0, as many workers as fit on each GPU (run_parallel). `retry_failed`: the failed runs
    train again. Returns (0: done, 3: preempted, OTHER_RUNNERS, STOPPED; the last sweep document: with STOPPED,
    the next stage's as the dry run designs it, nothing of it written)."""
    from transformer.design import plan
    from transformer.sweeps import outcome

    spec = SweepSpec.of(config)
    sched = schedule(spec.settings(), parallel)[0]  # how the runs train: what sweep.max_hours bounds, the ETA's
    preview, progress, trained = plan.design(spec, preview=True, schedule=sched), None, 0  # every stage: the ETA
    while True:
        if stages is not None and trained >= stages:  # stop where anything is left to do (nothing written)
            peek = next_stage.next_stage(workdir, spec, write=False, schedule=sched)
            if peek.todo or peek.plan.waiting:
                return STOPPED, peek.doc
        ns = next_stage.next_stage(workdir, spec, write=True, retry_failed=retry_failed, schedule=sched)
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
        if progress is None:  # kept across stages; its ETA packs each stage as the slots would
            progress = Progress(doc["runs"], {}, later, max(parallel, 1), settings=doc["sweep"], pack=sched.pack)
        code = (run_parallel(workdir, doc, parallel, progress, later) if parallel != 1
                else run_in_process(workdir, doc, verbose, progress, later))
        trained += 1
        if code:
            return code, doc
        if pending_runs(workdir, ns.todo)[0]:
            return OTHER_RUNNERS, doc
