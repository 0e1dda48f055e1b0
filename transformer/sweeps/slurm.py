"""A sweep on a SLURM cluster: DIR/sweep.sbatch, a job array of workers, one task per run that is ready to train
(a staged sweep, transformer/design/plan.py, submits its stages one at a time: rerun the command when a stage's
jobs have finished to submit the next)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any, Sequence

from transformer.spec import ConfigError
from transformer.sweeps.runner import REPO_ROOT, WORKER_MODULE


def slurm_script(workdir: str, doc: dict[str, Any], indices: Sequence[int] | None = None) -> str:
    """DIR/sweep.sbatch: a job array, one task per run index (`indices`, default all), each running the worker
    into DIR."""
    s = doc["sweep"]["slurm"]
    n = len(doc["runs"])
    workdir = os.path.abspath(workdir)
    tasks = f"0-{n - 1}" if indices is None else ",".join(str(i) for i in indices)
    array = tasks + (f"%{s['max_parallel']}" if s["max_parallel"] else "")
    lines = ["#!/bin/bash", f"#SBATCH --job-name=sweep-{doc['name']}", f"#SBATCH --array={array}",
             f"#SBATCH --time={s['time']}", "#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={s['cpus_per_task']}"]
    if s["gpus_per_task"]:
        lines.append(f"#SBATCH --gpus-per-task={s['gpus_per_task']}")
    for key in ("mem", "partition", "account"):
        if s[key]:
            lines.append(f"#SBATCH --{key}={s[key]}")
    lines += [f"#SBATCH --output={workdir}/slurm/%A_%a.out",
              "#SBATCH --signal=TERM@120",
              "# Each task trains one run into the shared DIR; on SIGTERM it checkpoints, and resubmitting resumes.",
              "set -euo pipefail", f"cd {REPO_ROOT}"]
    if s["setup"]:
        lines.append(s["setup"])
    lines.append(f"srun {sys.executable} -m {WORKER_MODULE} --workdir={workdir} "
                 "--run_index=$SLURM_ARRAY_TASK_ID --fit_when_done")
    return "\n".join(lines) + "\n"


def require_sbatch() -> None:
    if not shutil.which("sbatch"):
        raise ConfigError("--launcher=slurm: `sbatch` is not on PATH (no SLURM here); use --dry_run to print "
                          "the job script, or --launcher=local")


def submit_slurm(workdir: str, doc: dict[str, Any], indices: Sequence[int]) -> str:
    """Writes DIR/sweep.sbatch for the runs at `indices` and submits it; returns sbatch's output."""
    require_sbatch()
    os.makedirs(os.path.join(workdir, "slurm"), exist_ok=True)
    path = os.path.join(workdir, "sweep.sbatch")
    with open(path, "w") as f:
        f.write(slurm_script(workdir, doc, indices))
    out = subprocess.run(["sbatch", path], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"sbatch {path} failed: {out.stderr.strip()}")
    return out.stdout.strip()
