"""The sweep execution engine: runs a sweep's runs (in this process, in worker processes, or as one
worker for one run) and records each finished run in DIR/results.jsonl exactly once.

DIR/sweep.json holds the resolved sweep and every run's design numbers and full training config, so
a worker (`python -m experiments.sweep --workdir=DIR --run_index=I`, the unit of --parallel and of a
SLURM array task) needs nothing but DIR. Each run trains in DIR/runs/RUN_ID/; train() resumes an
interrupted run from its checkpoints and returns at once for a finished one.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from typing import Any, Container, Sequence

from transformer import files
from transformer.design.spec import SweepSpec
from transformer.spec import ConfigError
from transformer.sweeps import claims, execute, results, run_groups
from transformer.sweeps.execute import (  # one run's execution; re-exported: the runner's names since before
    CLAIMED_ELSEWHERE, SHAPE_KEYS, claim, load_sweep, record, result_row, run_config, seed_branch, train_run)
from transformer.sweeps.progress import Progress

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The command line that trains one run of DIR as a worker process (--parallel, SLURM array tasks). A process
# boundary, not an import: the library depends on no command-line module.
WORKER_MODULE = "experiments.sweep"


def sweep_document(config: Any, p: Any) -> dict[str, Any]:
    """What DIR/sweep.json holds: the resolved sweep section (p.spec, the budgets it chose filled in; else
    `config`'s) and base, the plan's notes and what it waits for, and every run designed so far (plan.design)
    with its time estimate."""
    from transformer.design.plan import estimate_seconds

    s = p.spec if p.spec is not None else SweepSpec.of(config)
    estimates = [estimate_seconds(r, s) for r in p.runs]
    return {"name": s.name, "mode": s.mode, "sweep": s.settings(), "base": json.loads(json.dumps(s.base)),
            "notes": list(p.notes), "waiting": p.waiting, "lr_fit": p.lr_fit,
            "estimated_seconds": float(sum(estimates)),
            "runs": [{**r.describe(), "estimated_seconds": e, "config": json.loads(json.dumps(r.config))}
                     for r, e in zip(p.runs, estimates)]}


def write_sweep(workdir: str, doc: dict[str, Any]) -> None:
    """Writes DIR/sweep.json. Its runs only grow (stage by stage, in order, so a worker's --run_index stays
    valid); a DIR holding a sweep with other runs is an error (use a new DIR). Nothing is written when the file
    already says the same (a finished sweep reruns in a read-only DIR), nor when `doc` is a waiting plan whose
    runs begin the recorded ones (a result a later stage was designed from went missing: its run trains again,
    and the next design must give the recorded runs). A DIR that cannot be written is one ConfigError."""
    path = os.path.join(workdir, "sweep.json")
    if os.path.exists(path):
        old_doc = load_sweep(workdir)
        if old_doc.get("data_identity"):  # the data its runs trained on: other data is refused, naming the change
            from transformer.data import identity
            identity.check_same(f"the sweep in {workdir}", old_doc["data_identity"], doc.get("data_identity"))
            doc["data_identity"] = doc.get("data_identity") or old_doc["data_identity"]
        old_ids = [r["run_id"] for r in old_doc["runs"]]
        new_ids = [r["run_id"] for r in doc["runs"]]
        if doc.get("waiting") and len(new_ids) < len(old_ids) and old_ids[:len(new_ids)] == new_ids:
            return
        if new_ids[:len(old_ids)] != old_ids and set(new_ids) != set(old_ids):
            differ = sorted(set(old_ids) ^ set(new_ids)) or [i for i, j in zip(old_ids, new_ids) if i != j]
            raise ConfigError(f"--workdir={workdir} holds a different sweep ({len(differ)} runs differ, "
                              f"e.g. {differ[0]}); use a new --workdir, or the same settings to resume")
        if json.loads(json.dumps(doc)) == old_doc:
            return
    try:
        os.makedirs(os.path.join(workdir, "runs"), exist_ok=True)
        files.write_json(path, doc, indent=1)
    except OSError as e:
        raise ConfigError(f"--workdir={workdir}: cannot write {path} ({e.strerror or e}); use a directory this "
                          "process can write") from e


def pending_runs(workdir: str, runs: Sequence[dict[str, Any]]) -> tuple[list[dict], dict[str, dict]]:
    """(runs without a results row, {run_id: row} of those with one, classified by execute.verdict)."""
    recorded = {r["run_id"]: r for r in execute.read_rows(workdir)}
    return [r for r in runs if r["run_id"] not in recorded], recorded


def _progress(doc: dict[str, Any], recorded: dict[str, dict], progress: Progress | None,
              later_seconds: float) -> Progress:
    if progress is None:
        return Progress(doc["runs"], recorded, later_seconds)
    progress.stage(doc["runs"], recorded, later_seconds)
    return progress


def run_in_process(workdir: str, doc: dict[str, Any], verbose: bool = False, progress: Progress | None = None,
                   later_seconds: float = 0.0) -> int:
    """Runs the pending runs one after another in this process (compiled programs and caches reused),
    or, with sweep.multirun, group by group. Runs claimed by another runner on the same DIR are left to it.
    `progress` (kept across stages) and `later_seconds` (the stages not designed yet): the ETA's."""
    todo, recorded = pending_runs(workdir, doc["runs"])
    progress = _progress(doc, recorded, progress, later_seconds)
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


def ready_to_submit(workdir: str, doc: dict[str, Any]) -> list[int]:
    """Indices of the runs without a results row whose branch source, if any, is recorded: what a SLURM
    submission of `doc` trains now (the command and its dry run)."""
    todo, recorded = pending_runs(workdir, doc["runs"])
    return [r["index"] for r in todo if not r.get("branch_from") or r["branch_from"] in recorded]


def run_parallel(workdir: str, doc: dict[str, Any], parallel: int, progress: Progress | None = None,
                 later_seconds: float = 0.0) -> int:
    """Runs the pending runs in `parallel` worker processes; each records its own result (progress and
    later_seconds as run_in_process's)."""
    todo, recorded = pending_runs(workdir, doc["runs"])
    index = {r["run_id"]: i for i, r in enumerate(doc["runs"])}
    progress = _progress(doc, recorded, progress, later_seconds)
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


def design_rows(workdir: str, config: Any = None) -> dict[str, dict[str, Any]]:
    """{run_id: row} the design reads (execute.read_rows: each row as the failure rule classifies it), after
    the runs of DIR/sweep.json that finished without a row are recorded from their run directories
    (execute.recover) and the claims that recorded runs left behind are removed (claims.release_recorded)."""
    for run_id in execute.recover(workdir):
        print(f"recorded {run_id} from its run directory (its results row was missing)", flush=True)
    rows = {r["run_id"]: r for r in execute.read_rows(workdir)}
    stale = SweepSpec.of(config).claim_timeout_s if config is not None else 600.0
    claims.release_recorded(workdir, rows, stale)
    return rows


def plan_and_write(workdir: str, config: Any) -> tuple[Any, dict[str, Any]]:
    """The plan from DIR's recorded results (plan.design on design_rows) and its DIR/sweep.json. `config`: a
    sweep config (ConfigDict or mapping) or its SweepSpec."""
    from transformer.data import identity
    from transformer.design import plan
    from transformer.spec import DataSpec
    from transformer.sweeps import outcome

    spec = SweepSpec.of(config)
    rows = design_rows(workdir, spec)
    p = plan.design(spec, rows, outcome.load_prediction(workdir))
    doc = {**sweep_document(spec, p), "data_identity": identity.peek(DataSpec.of(spec.base["data"]))}  # None until built
    write_sweep(workdir, doc)
    return p, doc


def later_seconds(preview: Any, doc: dict[str, Any]) -> float:
    """The estimated seconds of the stages of `preview` (plan.design(preview=True): every stage from the priors)
    that `doc` has not designed yet."""
    from transformer.design.plan import estimate_seconds

    designed = {r["stage"] for r in doc["runs"]}
    return float(sum(estimate_seconds(r, preview.spec) for r in preview.runs if r.stage not in designed))


def run_sweep(workdir: str, config: Any, parallel: int = 1,
              verbose: bool = False) -> tuple[int, dict[str, Any]]:
    """Trains the sweep stage by stage (plan.py): design from the results so far, train what is pending, again
    until every stage is designed and recorded; the prediction is written (outcome.predict) before the
    validation run is designed. Returns (0: done, 3: preempted, OTHER_RUNNERS; the last sweep document)."""
    from transformer.design import plan
    from transformer.sweeps import outcome

    spec = SweepSpec.of(config)
    preview, progress = plan.design(spec, preview=True), None  # the whole sweep from the priors: the ETA's
    while True:
        p, doc = plan_and_write(workdir, spec)
        if p.waiting == "prediction":
            pred = outcome.predict(workdir, doc)
            if pred["params"] is None:
                print(f"warning: {pred['note']}; see {workdir}/fit/fit.json", flush=True)
                continue
            print(outcome.prediction_line(workdir, pred), flush=True)
            continue
        todo, _ = pending_runs(workdir, doc["runs"])
        if not todo:
            if p.waiting is None:
                print(f"0 runs to go: all {len(doc['runs'])} runs of {workdir} are recorded", flush=True)
                return 0, doc
            raise RuntimeError(f"the sweep plan waits for {p.waiting} but has no run to train (a bug)")
        if p.waiting:
            print(f"stage: {len(todo)} runs, then {p.waiting} decides the next stage", flush=True)
        later = later_seconds(preview, doc)
        progress = progress or Progress(doc["runs"], {}, later)
        code = (run_parallel(workdir, doc, parallel, progress, later) if parallel > 1
                else run_in_process(workdir, doc, verbose, progress, later))
        if code:
            return code, doc
        if pending_runs(workdir, todo)[0]:
            return OTHER_RUNNERS, doc
