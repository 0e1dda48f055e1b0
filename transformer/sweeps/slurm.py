"""A sweep on a SLURM cluster: the job scripts and their submission.

Each stage of a sweep (transformer/design/plan.py) is a job array, one task per run that is ready to train
(runs grouped by their time limit: one array per limit), and a small driver job that starts when those arrays
have ended (--dependency=afterany: tasks that exit 3, preempted, or 4, claimed elsewhere, must not hang it) and
reruns the sweep command, which records what the tasks left unrecorded, then submits the next stage or fits
(slurm_jobs.py). The scripts are DIR/slurm/stageK.sbatch and DIR/slurm/stageK-driver.sbatch; task logs
DIR/slurm/ARRAY_TASK.out (appended across requeues), driver logs DIR/slurm/driver-JOB.out.

A task checkpoints and requeues itself (scontrol requeue) when SLURM sends `slurm.signal` `signal_seconds`
before its time limit: the worker preempts on that signal (transformer/training/guards.py) like on SIGTERM.
"""
from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import Any, Sequence

from transformer.spec import ConfigError
from transformer.sweeps import slurm_query
from transformer.sweeps.runner import REPO_ROOT, WORKER_MODULE

REQUEUE_SIGNAL_ENV = "SWEEP_REQUEUE_SIGNAL"  # set in a task's environment: the signal to requeue on
TASK_END = "sweep-task: exit"  # the job script's last line in a task log: "sweep-task: exit CODE in PHASE ..."
MAX_REQUEUES = 50  # a task requeues itself at its time limit at most this often (then exits 3: preempted)
_NICE_MINUTES = (10, 15, 20, 30, 45, 60, 90, 120, 180, 240, 360, 480, 720, 960, 1440, 2160, 2880, 4320, 7200)


def hms(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def minutes_of(limit: str) -> float | None:
    """SLURM's time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in minutes; inf for
    UNLIMITED/INFINITE; None where it is not one."""
    t = limit.strip()
    if t.upper() in ("UNLIMITED", "INFINITE"):
        return math.inf
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", t)
    if not m:
        return None
    d, a, b, c = (int(x) if x else None for x in m.groups())
    if d is not None:  # D-HH[:MM[:SS]]
        return d * 1440 + a * 60 + (b or 0) + (c or 0) / 60
    if c is not None:  # HH:MM:SS
        return a * 60 + b + c / 60
    return a + (b or 0) / 60  # MM[:SS]


def time_limit(run: dict[str, Any], s: dict[str, Any], cap_min: float = math.inf) -> str:
    """A run's --time: slurm.time as given, or ("auto") time_factor × the plan's estimate for the run, at
    least 10 minutes, rounded up to a round number of minutes (so runs of similar length share an array),
    at most the partition's limit `cap_min` (a longer run requeues itself at the limit and resumes)."""
    if s["time"] != "auto":
        return s["time"]
    need = s["time_factor"] * run["estimated_seconds"] / 60
    minutes = next((m for m in _NICE_MINUTES if m >= need), int(math.ceil(need / 1440)) * 1440)
    return hms(int(min(minutes, cap_min)))


def _gpu_lines(s: dict[str, Any]) -> list[str]:
    n = int(s["gpus_per_task"])
    if not n:
        return []
    if s["gpu_request"] == "gres":
        return [f"--gres=gpu:{s['gpu_type'] + ':' if s['gpu_type'] else ''}{n}"]
    if s["gpu_request"] in ("gpus", "gpus-per-task"):
        return [f"--{s['gpu_request']}={s['gpu_type'] + ':' if s['gpu_type'] else ''}{n}"]
    raise ConfigError(f"sweep.slurm.gpu_request={s['gpu_request']!r}: choose gres, gpus or gpus-per-task")


def _common_lines(s: dict[str, Any]) -> list[str]:
    """Placement options that the arrays and the driver share: partition, account, qos, constraint, exclude,
    and slurm.sbatch_options (each its own #SBATCH line)."""
    lines = [f"--{k}={s[k]}" for k in ("partition", "account", "qos", "constraint", "exclude") if s.get(k)]
    return lines + shlex.split(s.get("sbatch_options") or "")


def _task_script(workdir: str, doc: dict[str, Any], indices: Sequence[int], limit: str) -> str:
    s = doc["sweep"]["slurm"]
    array = ",".join(str(i) for i in indices) + (f"%{s['max_parallel']}" if s["max_parallel"] else "")
    opts = [f"--job-name=sweep-{doc['name']}", f"--array={array}", f"--time={limit}", "--ntasks=1",
            f"--cpus-per-task={s['cpus_per_task']}", *_gpu_lines(s), *([f"--mem={s['mem']}"] if s["mem"] else []),
            *_common_lines(s), f"--output={workdir}/slurm/%A_%a.out", "--open-mode=append", "--requeue",
            f"--signal={s['signal']}@{s['signal_seconds']}"]
    task = "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
    lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in opts),
             f"# One task per run into the shared DIR. At SIG{s['signal']} ({s['signal_seconds']} s before the time "
             "limit) the worker checkpoints and requeues the task; it resumes from its checkpoint.",
             "set -uo pipefail", "phase=setup",
             f"trap 'echo \"{TASK_END} $? in $phase (task {task}, attempt $((${{SLURM_RESTART_COUNT:-0}} + 1)))\"' "
             "EXIT",
             "set -e",
             f"echo \"sweep-task: {task} starts on $(hostname) at $(date -u +%FT%TZ)\"",
             f"cd {shlex.quote(REPO_ROOT)}"]
    if s["setup"]:
        lines.append(s["setup"])
    lines += ["phase=worker", f"export {REQUEUE_SIGNAL_ENV}={s['signal']}",
              f"srun --ntasks=1 --cpus-per-task={s['cpus_per_task']} {shlex.quote(sys.executable)} -m {WORKER_MODULE} "
              f"--workdir={shlex.quote(workdir)} --run_index=$SLURM_ARRAY_TASK_ID --fit_when_done"]
    return "\n".join(lines) + "\n"


def slurm_script(workdir: str, doc: dict[str, Any], indices: Sequence[int] | None = None) -> str:
    """The job scripts for the runs at `indices` (default all) of `doc`, one job array per time limit, joined
    (what --dry_run prints)."""
    groups = array_groups(workdir, doc, list(range(len(doc["runs"]))) if indices is None else indices)
    return "\n".join(script for _, _, script in groups)


def array_groups(workdir: str, doc: dict[str, Any], indices: Sequence[int],
                 cap_min: float = math.inf) -> list[tuple[str, list[int], str]]:
    """[(time limit, indices, job script)], one job array per distinct time limit, longest first."""
    workdir = os.path.abspath(workdir)
    s = doc["sweep"]["slurm"]
    by_limit: dict[str, list[int]] = {}
    for i in indices:
        by_limit.setdefault(time_limit(doc["runs"][i], s, cap_min), []).append(i)
    order = sorted(by_limit, key=lambda t: -(minutes_of(t) or 0))
    return [(t, by_limit[t], _task_script(workdir, doc, by_limit[t], t)) for t in order]


def driver_script(workdir: str, doc: dict[str, Any], after: Sequence[str], command: Sequence[str], cwd: str) -> str:
    """The driver job: after the arrays `after` have ended (afterany), reruns the sweep `command` from `cwd`."""
    s = doc["sweep"]["slurm"]
    opts = [f"--job-name=sweep-{doc['name']}-next", f"--dependency=afterany:{':'.join(after)}",
            f"--time={s['driver_time']}", "--ntasks=1", "--cpus-per-task=1", *_common_lines(s),
            f"--output={os.path.abspath(workdir)}/slurm/driver-%j.out", "--open-mode=append"]
    lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in opts),
             "# The sweep's next step: record what the arrays left, then submit the next stage or fit.",
             "set -euo pipefail", f"cd {shlex.quote(cwd)}"]
    if s["setup"]:
        lines.append(s["setup"])
    lines.append(" ".join(shlex.quote(c) for c in command))
    return "\n".join(lines) + "\n"


def require_sbatch() -> None:
    if not shutil.which("sbatch"):
        raise ConfigError("--launcher=slurm: `sbatch` is not on PATH (no SLURM here); use --dry_run to print "
                          "the job script, or --launcher=local")


_ADVICE = (  # sbatch's error → what to change
    ("generic resource", "the partition has no such GPUs: on a CPU partition set --config.sweep.slurm.gpus_per_task=0; "
                         "on a GPU cluster match slurm.gpu_request (gres, gpus) and slurm.gpu_type to `sinfo -o %G`"),
    ("partition", "set --config.sweep.slurm.partition to one that `sinfo -s` lists"),
    ("account", "set --config.sweep.slurm.account to one of yours (`sacctmgr show assoc user=$USER`)"),
    ("qos", "set --config.sweep.slurm.qos to one your account may use (`sacctmgr show qos`)"),
    ("feature", "set --config.sweep.slurm.constraint to features that `sinfo -o %f` lists"),
    ("time limit", "set --config.sweep.slurm.time (or driver_time) within the partition's limit (`sinfo -o %l`)"),
    ("node configuration", "no node offers that many CPUs, that much memory or those GPUs: compare "
                           "slurm.cpus_per_task, mem and gpus_per_task with `sinfo -o '%P %c %m %G'`"),
    ("memory", "lower --config.sweep.slurm.mem (`sinfo -o '%P %m'` gives each node's MB)"),
)


def sbatch(path: str) -> str:
    """Submits job script `path`; returns the job id. sbatch's refusal is one ConfigError line with advice."""
    out = subprocess.run(["sbatch", "--parsable", path], capture_output=True, text=True)
    if out.returncode:
        errors = [ln.strip() for ln in out.stderr.splitlines() if ln.strip()]
        msg = next((e for e in errors if "error" in e.lower()), errors[-1] if errors else f"exit {out.returncode}")
        advice = next((a for key, a in _ADVICE if key in msg.lower()),
                      "see `man sbatch`; other #SBATCH options go in --config.sweep.slurm.sbatch_options")
        raise ConfigError(f"sbatch refused {path}: {msg.removeprefix('sbatch: ')}; {advice}")
    return out.stdout.strip().split(";")[0]


def _mb(mem: str) -> float | None:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)B?", str(mem).strip().upper())
    if not m:
        return None
    return float(m.group(1)) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 ** 2}[m.group(2)]


def _gpus(gres: str, gpu_type: str) -> int:
    """GPUs of `gpu_type` (any type when "") in a sinfo gres field, e.g. "gpu:a100:4(S:0-1),shard:8"."""
    total = 0
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] != "gpu" or (gpu_type and (len(parts) < 3 or parts[1] != gpu_type)):
            continue
        total = max(total, int(parts[-1]) if parts[-1].isdigit() else 1)
    return total


def check_partition(s: dict[str, Any]) -> float:
    """Refuses (ConfigError) what no node of the partition can give, before submitting: an unknown partition,
    more CPUs, memory or GPUs per task than its largest node has, a time beyond its limit. Returns the
    partition's time limit in minutes (inf: none, or sinfo did not answer)."""
    groups = slurm_query.partitions()
    if not groups:
        return math.inf
    name = s["partition"]
    if not name:
        default = [g for g in groups if g["partition"].endswith("*")]
        if not default:
            return math.inf
        name = default[0]["partition"].rstrip("*")
    mine = [g for g in groups if g["partition"].rstrip("*") == name]
    if not mine:
        listed = sorted({g["partition"].rstrip("*") for g in groups})
        raise ConfigError(f"sweep.slurm.partition={name!r}: no such partition; sinfo lists {', '.join(listed)}")
    where = f"partition {name} (sinfo)"
    cpus = max(int(re.sub(r"\D", "", g["cpus"]) or 0) for g in mine)
    if int(s["cpus_per_task"]) > cpus:
        raise ConfigError(f"sweep.slurm.cpus_per_task={s['cpus_per_task']}: the largest node of {where} has {cpus} "
                          f"CPUs, so the tasks would pend forever; ask for at most {cpus}")
    memory = max(float(re.sub(r"[^\d.]", "", g["memory"]) or 0) for g in mine)
    want = _mb(s["mem"]) if s["mem"] else None
    if want is not None and memory and want > memory:
        raise ConfigError(f"sweep.slurm.mem={s['mem']}: the largest node of {where} has {memory:.0f} MB; ask for less")
    n = int(s["gpus_per_task"])
    if n:
        have = max(_gpus(g["gres"], s["gpu_type"]) for g in mine)
        if have < n:
            kind = f"{s['gpu_type']} GPUs" if s["gpu_type"] else "GPUs"
            raise ConfigError(f"sweep.slurm.gpus_per_task={n}: the nodes of {where} have {have or 'no'} {kind} "
                              f"(gres {', '.join(sorted({g['gres'] for g in mine}))}); on a CPU partition set "
                              f"--config.sweep.slurm.gpus_per_task=0, else choose slurm.partition (and gpu_type)")
    limit = max((minutes_of(g["timelimit"]) or math.inf) for g in mine)
    for key in ("time", "driver_time"):
        if s[key] != "auto":
            asked = minutes_of(s[key])
            if asked is None:
                raise ConfigError(f"sweep.slurm.{key}={s[key]!r}: not a SLURM time; write HH:MM:SS or D-HH:MM:SS")
            if asked > limit:
                raise ConfigError(f"sweep.slurm.{key}={s[key]}: {where} allows at most {hms(int(limit))}; the "
                                  f"tasks would pend forever (PartitionTimeLimit)")
    if all(g["avail"] != "up" for g in mine):
        print(f"warning: {where} is {mine[0]['avail']}: the jobs will pend until it is up", flush=True)
    return limit


def arm_requeue() -> int | None:
    """In a SLURM task whose job script names a requeue signal (REQUEUE_SIGNAL_ENV): training preempts on it
    like on SIGTERM (checkpoint, then stop), and one that arrives before training starts is ignored rather
    than killing the task. Returns the signal's number (None: not such a task)."""
    import signal

    from transformer.training import guards

    name = os.environ.get(REQUEUE_SIGNAL_ENV, "").upper().removeprefix("SIG")
    signum = getattr(signal, f"SIG{name}", None) if name else None
    if signum is None or slurm_query.own_task() is None:
        return None
    guards.also_preempt_on(signum)
    signal.signal(signum, signal.SIG_IGN)
    return signum


def requeue_if_signalled(signum: int | None) -> bool:
    """After a preempted run: when the requeue signal stopped it, `scontrol requeue` this task (SLURM ends this
    attempt and starts the task again, which resumes from the checkpoint). Returns whether it did."""
    from transformer.training import guards

    task = slurm_query.own_task()
    if signum is None or task is None or guards.last_preemption_signal() != signum:
        return False
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    if restarts >= MAX_REQUEUES:  # a run that cannot get anywhere in one attempt must not loop forever
        print(f"time limit near (signal {signum}): checkpointed; not requeued after {restarts} requeues "
              f"(slurm.MAX_REQUEUES): the sweep command submits the run again, or records it as failed", flush=True)
        return False
    ok = slurm_query.requeue(task)
    print(f"time limit near (signal {signum}): checkpointed; "
          + (f"requeued SLURM task {task}" if ok else f"`scontrol requeue {task}` failed: rerun the sweep command"),
          flush=True)
    return ok
