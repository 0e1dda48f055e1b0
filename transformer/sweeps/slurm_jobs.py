"""One step of a sweep on SLURM (what `--launcher=slurm` and its driver jobs run), and the sweep's jobs.

A step: (1) if the sweep's jobs (DIR/slurm/jobs.jsonl) are still queued, say so, with why they pend, and submit
nothing; (2) record the runs whose tasks ended without a results row (reconcile: the task logs' last line,
sacct or scontrol): a failed setup line or a worker that died is a failed row with the log's tail, a preempted
or cancelled task is submitted again (at most slurm.max_submits times), a worker stopped by an environment failure
(a module not installed: execute.EnvironmentFailure) stops the sweep with its error, unrecorded; (3) stop if a run failed (fix the
cause, rerun with --retry_failed); (4) design the next stage (next_stage.next_stage), validate its runs locally as
the training's resolve step does, check the partition (sinfo) and submit its arrays and a driver job that
reruns the command when they have ended; (5) or, everything recorded, say so (the caller fits).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import types
from typing import Any, Sequence


from transformer import file_claims
from transformer.spec import ConfigError
from transformer.sweeps import execute, next_stage, results, runner, slurm, slurm_query
from transformer.sweeps.execute import CLAIMED_ELSEWHERE, result_row

JOBS = "jobs.jsonl"  # in DIR/slurm/: one line per submission {"stage", "arrays": {id: [indices]}, "driver", ...}
_INTERRUPTED = {"CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "REQUEUED", "BOOT_FAIL", "DEADLINE",
                "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
_SIGNAL_EXITS = {128 + s for s in (1, 2, 9, 10, 12, 15)}  # killed by HUP, INT, KILL, USR1, USR2, TERM
_HOPELESS = ("PartitionTimeLimit", "PartitionNodeLimit", "ReqNodeNotAvail", "BadConstraints", "InvalidAccount",
             "InvalidQOS", "QOSMaxCpuPerJobLimit", "QOSMaxGRESPerJob", "AssocMaxCpuPerJobLimit",
             "DependencyNeverSatisfied", "PartitionConfig")


def slurm_dir(workdir: str) -> str:
    return os.path.join(workdir, "slurm")


def submissions(workdir: str) -> list[dict[str, Any]]:
    path = os.path.join(slurm_dir(workdir), JOBS)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _append(workdir: str, entry: dict[str, Any]) -> None:
    with open(os.path.join(slurm_dir(workdir), JOBS), "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _job_ids(subs: Sequence[dict[str, Any]]) -> list[str]:
    return [j for s in subs for j in [*s.get("arrays", {}), *([s["driver"]] if s.get("driver") else [])]]


def queued(workdir: str) -> dict[str, tuple[str, str]]:
    """{task id: (state, reason)} of the sweep's jobs still in the queue, this job itself left out."""
    ids = [j for j in _job_ids(submissions(workdir)) if j not in slurm_query.own_job_ids()]
    q = slurm_query.queue(ids)
    if q is None:
        raise ConfigError(f"squeue failed, so whether the jobs of {workdir} are still queued is unknown; submitting "
                          f"again could train runs twice. Check `squeue` and rerun")
    own = slurm_query.own_job_ids()
    return {t: v for t, v in q.items() if t not in own and t.split("_")[0] not in own}


def describe(q: dict[str, tuple[str, str]]) -> str:
    """'job 12: 2 RUNNING, 3 PENDING (Resources); job 14: PENDING (Dependency)'."""
    by_job: dict[str, dict[str, int]] = {}
    for task, (state, reason) in sorted(q.items()):
        key = state + (f" ({reason})" if reason and reason != "None" and state == "PENDING" else "")
        counts = by_job.setdefault(task.split("_")[0], {})
        n = 1
        m = re.search(r"\[(.*)\]", task)  # a pending array's unstarted tasks: "12_[1-3,5%2]"
        if m:
            n = sum(int(b) - int(a) + 1 if "-" in p else 1 for p in m.group(1).split("%")[0].split(",")
                    for a, _, b in [p.partition("-")])
        counts[key] = counts.get(key, 0) + n
    return "; ".join(f"job {j}: " + ", ".join(f"{n} {k}" for k, n in c.items()) for j, c in by_job.items())


def hopeless(q: dict[str, tuple[str, str]]) -> list[str]:
    """The pending reasons in `q` that will not pass by themselves."""
    return sorted({r for s, r in q.values() if s == "PENDING" and any(r.startswith(h) for h in _HOPELESS)})


def _log_end(path: str) -> tuple[int | None, str | None, str]:
    """(exit code, phase) from a task log's last "sweep-task: exit CODE in PHASE" line (None, None if it has
    none: the task was killed), and the last lines of its latest attempt."""
    if not os.path.exists(path):
        return None, None, ""
    with open(path, errors="replace") as f:
        lines = [ln.rstrip() for ln in f.read().splitlines() if ln.strip()]
    ends = [i for i, ln in enumerate(lines) if ln.startswith(slurm.TASK_END)]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("sweep-task: ") and " starts on " in ln]
    start = starts[-1] + 1 if starts else 0
    code = phase = None
    if ends and ends[-1] >= start:
        m = re.match(re.escape(slurm.TASK_END) + r" (\d+) in (\w+)", lines[ends[-1]])
        code, phase = (int(m.group(1)), m.group(2)) if m else (None, None)
    tail = [ln for ln in lines[start:] if not ln.startswith("sweep-task: ")][-6:]
    return code, phase, " | ".join(tail)[-800:]


def _classify(code: int | None, phase: str | None, state: tuple[str, int | None] | None, tail: str,
              log: str) -> str | None:
    """Why a task that left no results row failed, or None where it was interrupted (submit it again)."""
    if phase == "setup" and code:
        return (f"the job script's setup lines (sweep.slurm.setup) failed with exit {code} before the run "
                f"started: {tail or 'no output'} (log: {log})")
    if phase == "worker" and code is not None:
        if code in (0, 3, CLAIMED_ELSEWHERE) or code in _SIGNAL_EXITS:
            return None
        return f"the worker exited {code} without recording the run: {tail or 'no output'} (log: {log})"
    if state is not None:
        name, exit_code = state
        if name in _INTERRUPTED or name in slurm_query.ALIVE or name in ("PENDING", "COMPLETED"):
            return None
        what = "ran out of memory (raise sweep.slurm.mem)" if name == "OUT_OF_MEMORY" else f"ended {name}"
        return f"the SLURM task {what}, exit {exit_code}: {tail or 'no output'} (log: {log})"
    return None  # no trace at all: killed before it could say anything; submit again (max_submits caps it)


def reconcile(workdir: str, doc: dict[str, Any]) -> list[str]:
    """Records the runs whose SLURM tasks ended without a results row: a failure as a failed row (its log's
    tail and exit code), an interruption as nothing (the run is submitted again) unless the run was submitted
    slurm.max_submits times. Returns the run ids recorded as failed. A task whose worker stopped for an environment
    failure (execute.ENVIRONMENT_EXIT: a module not installed) records nothing: the first time it is seen it is
    raised (the EnvironmentFailure of its log's `error:` line: the sweep stops, exit 2) and noted in jobs.jsonl, so
    that the command rerun after the fix submits its run again."""
    subs = submissions(workdir)
    recorded = {r["run_id"] for r in results.read_results(workdir)}
    by_id = {r["run_id"]: r for r in doc["runs"]}
    last: dict[str, tuple[str, int]] = {}  # run_id -> (array id, index) of its latest submission
    count: dict[str, int] = {}
    for s in subs:
        for rid in s.get("retried", []):
            count[rid] = 0
        for array, indices in s.get("arrays", {}).items():
            for i in indices:
                rid = s["run_ids"][str(i)]
                last[rid], count[rid] = (array, i), count.get(rid, 0) + 1
    unrecorded = {rid: v for rid, v in last.items() if rid not in recorded and rid in by_id}
    if not unrecorded:
        return []
    ended = slurm_query.ended_tasks({a for a, _ in unrecorded.values()})
    failed, stopped = [], []
    reported = {t for s in subs for t in s.get("environment", [])}
    max_submits = int(doc["sweep"]["slurm"].get("max_submits", 3))
    for rid, (array, i) in unrecorded.items():
        task = f"{array}_{i}"
        log = os.path.join(slurm_dir(workdir), f"{task}.out")
        code, phase, tail = _log_end(log)
        if phase == "worker" and code == execute.ENVIRONMENT_EXIT:  # not recorded: submitted again after the fix
            if task not in reported:
                stopped.append((task, log, rid))
            continue
        error = _classify(code, phase, ended.get(task), tail, log)
        if error is None and count[rid] >= max_submits:
            error = (f"submitted {count[rid]} times (sweep.slurm.max_submits), each task ended without a result; "
                     f"last: {tail or 'no output'} (log: {log})")
        if error is None:
            continue
        if execute.recover(workdir, {**doc, "runs": [by_id[rid]]}):  # it finished; only its row was lost
            continue
        row = result_row(by_id[rid], None, execute.FAILED, error, 0.0, doc["mode"])
        row["slurm_task"] = task
        if results.append_result(workdir, row):
            failed.append(rid)
    if stopped:  # reported once: the command rerun after the fix submits those runs again
        _append(workdir, {"environment": [t for t, _, _ in stopped], "time": time.time()})
        task, log, rid = stopped[0]
        raise execute.logged_environment_failure(log, rid)
    return failed


def _failed_rows(workdir: str) -> list[dict[str, Any]]:
    """The rows of runs that failed (execute.verdict; a diverged run is an observation, not a failure)."""
    return [r for r in execute.read_rows(workdir) if r["status"] == execute.FAILED]


def validate_locally(workdir: str, doc: dict[str, Any], indices: Sequence[int]) -> set[str]:
    """The training's own resolve step (model, train, mesh, data and logging checks; the data's files and
    tokenizer; a dataset not prepared yet is prepared here) for the runs about to be submitted, here, before
    any task starts: a mistake is one ConfigError now, not a failure of every task. Runs that differ only in shape, steps or learning rate resolve alike:
    the first one's data is resolved, every one's model and train settings, each run's config as its task gets
    it (execute.run_config: the sweep's data pin included). Returns the checked run ids."""
    from transformer.data import identity, sources, tokenizers
    from transformer.spec import DataSpec
    from transformer.training.resolve import model_config, resolve

    gpus = int(doc["sweep"]["slurm"]["gpus_per_task"]) or 1
    seen_data: set[str] = set()
    for i in indices:
        config = execute.run_config(workdir, doc["runs"][i], doc)  # a plain nested dict, as the task trains it
        key = json.dumps(config["data"], sort_keys=True)
        if key in seen_data:
            DataSpec.of(config["data"])
            model_config(config, int(config["model"].get("vocab_size", 0)) or 256)
            continue
        seen_data.add(key)
        data = DataSpec.of(config["data"])
        if not sources.is_available(data):  # a dataset not prepared yet: here, once, not by every task at once
            print(f"preparing the dataset {data.tfds_name} in {data.data_dir or '$TFDS_DATA_DIR'} before "
                  f"submitting (the tasks read it from there)", flush=True)
            identity.ensure_available(data)  # an unknown dataset: ConfigError
        tokenizer = None
        if data.tokenizer == "sentencepiece" and not os.path.exists(tokenizers.sentencepiece_path(data)):
            tokenizer = types.SimpleNamespace(vocab_size=data.vocab_size)  # trained by the first task
        resolve(config, gpus, 1, tokenizer)
    return {doc["runs"][i]["run_id"] for i in indices}


def stage_number(workdir: str) -> int:
    return len([s for s in submissions(workdir) if s.get("arrays")]) + 1


def submit(workdir: str, doc: dict[str, Any], indices: Sequence[int], command: Sequence[str] | None,
           cwd: str, cap_min: float = float("inf")) -> dict[str, Any]:
    """Submits the arrays for the runs at `indices` (one per time limit, at most `cap_min` minutes: the
    partition's limit) and, with a `command`, the driver job after them; records the job ids in
    DIR/slurm/jobs.jsonl. Returns the entry."""
    k = stage_number(workdir)
    sd = slurm_dir(workdir)
    arrays: dict[str, list[int]] = {}
    limits: dict[str, str] = {}
    for j, (limit, idx, script) in enumerate(slurm.array_groups(workdir, doc, indices, cap_min)):
        path = os.path.join(sd, f"stage{k}.sbatch" if j == 0 else f"stage{k}-{j + 1}.sbatch")
        with open(path, "w") as f:
            f.write(script)
        job = slurm.sbatch(path)
        arrays[job], limits[job] = idx, limit
    entry = {"stage": k, "arrays": arrays, "limits": limits, "driver": None, "time": time.time(),
             "run_ids": {str(i): doc["runs"][i]["run_id"] for i in indices}}
    _append(workdir, entry)  # recorded at once: a failing driver submission loses nothing
    if command:
        path = os.path.join(sd, f"stage{k}-driver.sbatch")
        with open(path, "w") as f:
            f.write(slurm.driver_script(workdir, doc, list(arrays), command, cwd))
        entry["driver"] = slurm.sbatch(path)
        _append(workdir, {"stage": k, "driver": entry["driver"], "time": time.time()})
    return entry


def step(workdir: str, config: Any, command: Sequence[str] | None, cwd: str,
         retry_failed: bool = False) -> tuple[str, dict[str, Any] | None]:
    """One step of the sweep on SLURM (module docstring). Returns (status, sweep document): "queued" (its jobs
    are in the queue), "submitted", "failed" (a run failed: stopped), "stuck" (nothing ready, nothing
    queued), "done" (every run recorded)."""
    from transformer.design.spec import SweepSpec

    config = SweepSpec.of(config)  # a sweep config (ConfigDict or mapping) or its spec
    os.makedirs(slurm_dir(workdir), exist_ok=True)
    with file_claims.hold(os.path.join(slurm_dir(workdir), "submit.claim")):  # two commands at once: one submits
        q = queued(workdir)
        if q:
            print(f"the sweep's jobs are in the queue ({describe(q)}); nothing submitted again "
                  f"(scancel {' '.join(sorted({t.split('_')[0] for t in q}))} stops them)", flush=True)
            _warn_hopeless(q)
            return "queued", None
        cap = slurm.check_partition(dataclasses.asdict(config.slurm))  # what no node can give: refused before anything
        if os.path.exists(os.path.join(workdir, "sweep.json")):
            for rid in reconcile(workdir, runner.load_sweep(workdir)):
                print(f"recorded {rid} as failed (its SLURM task ended without a result)", flush=True)
        if retry_failed:
            retried = execute.drop_failed(workdir)
            if retried:
                _append(workdir, {"retried": retried, "time": time.time()})
            print(f"retrying {len(retried)} failed runs", flush=True)
        failed = _failed_rows(workdir)
        if failed:
            for r in failed:
                print(f"FAILED {r['run_id']}: {r.get('error')}", flush=True)
            print(f"stopped: {len(failed)} runs failed (rows in {workdir}/results.jsonl); fix the cause and rerun "
                  f"with --retry_failed to submit them again", flush=True)
            return "failed", None
        first = next_stage.next_stage(workdir, config, write=False, predict=False)  # in memory, checked, then written
        checked = validate_locally(workdir, first.doc, runner.ready_to_submit(workdir, first.doc, first.rows))
        ns = next_stage.next_stage(workdir, config, write=True)  # the prediction, where the plan waits for it
        if ns.prediction is not None:
            from transformer.sweeps import outcome
            outcome.announce_prediction(workdir, ns.prediction)
        p, doc = ns.plan, ns.doc
        todo, _ = runner.pending_runs(workdir, doc["runs"])
        ready = runner.ready_to_submit(workdir, doc)
        if not todo:
            return "done", doc
        if not ready:
            print("no run is ready to train (they wait for runs not yet recorded)", flush=True)
            return "stuck", doc
        validate_locally(workdir, doc, [i for i in ready if doc["runs"][i]["run_id"] not in checked])  # after a prediction
        entry = submit(workdir, doc, ready, command, cwd, cap)
    arrays = ", ".join(f"{a} ({len(i)} runs, --time={entry['limits'][a]})" for a, i in entry["arrays"].items())
    print(f"stage {entry['stage']}: submitted {len(ready)} runs as job array {arrays}"
          + (f"; driver job {entry['driver']} then reruns this command" + (f" ({p.waiting} decides the next stage)"
                                                                           if p.waiting else " (to fit)")
             if entry["driver"] else ""), flush=True)
    time.sleep(1.0)  # the scheduler's first pass gives the pending reasons
    q = queued(workdir)
    if q:
        print(f"queue: {describe(q)}", flush=True)
        _warn_hopeless(q)
    return "submitted", doc


def _warn_hopeless(q: dict[str, tuple[str, str]]) -> None:
    for reason in hopeless(q):
        print(f"warning: jobs pend for a reason that will not pass by itself: {reason}; scancel them and fix the "
              f"sweep.slurm settings (sinfo, sacctmgr show assoc)", flush=True)


def wait(workdir: str, poll_s: float = 5.0) -> None:
    """Until none of the sweep's jobs is queued; prints the queue (states, why tasks pend) when it changes."""
    shown = None
    while True:
        q = queued(workdir)
        if not q:
            return
        now = describe(q)
        if now != shown:
            done = len(results.read_results(workdir))
            print(f"[{time.strftime('%H:%M:%S')}] {done} runs recorded; queue: {now}", flush=True)
            _warn_hopeless(q)
            shown = now
        time.sleep(poll_s)
