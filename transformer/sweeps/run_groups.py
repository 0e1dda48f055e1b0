"""sweep.multirun in the sweep runner: which pending runs train together, and training one group.

Runs that share their shape and data and differ only in learning rate or seed (an LR scan's sizes,
repeats) train as one vmapped program (transformer/training/loop.train_runs); each is still configured (its
data pin included), claimed, recorded and resumable on its own by transformer/sweeps/execute.py, as
runner.run_in_process does for single runs: this module only schedules.
"""
from __future__ import annotations

import os
import traceback
from typing import Any, Sequence

from transformer.sweeps import execute
from transformer.sweeps.progress import Progress, units_of


def groups(workdir: str, runs: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """sweep.multirun: the runs in order of their first member, gathered into groups that can train as
    one program (grouping.group_key: same shape and data, other learning rate or seed). A run that
    already finished (summary.json "ok", its row not yet written) stays alone: train() records it at once."""
    from transformer.training.grouping import group_key

    return units_of(runs, lambda run: None if execute.finished_summary(workdir, run) is not None
                    else group_key(run["config"]))


def train_group_runs(workdir: str, doc: dict[str, Any], group: Sequence[dict[str, Any]], progress: Progress,
                     verbose: bool = False) -> int:
    """Claims the runs of `group` and trains them as one program (sweep.multirun; loop.train_runs). Runs
    another runner holds are left to it; if the group fails or its runs' checkpoints are at different
    steps, its runs train one by one, resuming from the group's checkpoints; an environment failure (execute:
    a module not installed) stops the sweep, nothing recorded. Returns 3 if preempted."""
    from transformer.training.loop import train_runs  # imported late: the caller sets up JAX first

    held = []
    for run in group:
        c = execute.claim(workdir, doc, run)
        if c is None:
            progress.event(f"skip {run['run_id']}: claimed by another runner")
        else:
            held.append((run, c))
    runs = [r for r, _ in held]
    try:
        summaries = None
        for run in runs:
            progress.started(run)
        if len(runs) > 1:
            try:
                summaries = train_runs([execute.run_config(workdir, r, doc) for r in runs],
                                        [os.path.join(workdir, "runs", r["run_id"]) for r in runs], verbose=verbose,
                                        claim_dead=execute.held_by_sweep)
            except Exception as e:  # the runs go on alone, from the group's checkpoints
                if verbose:
                    traceback.print_exc()
                stop = execute.environment_failure(e, runs[0]["run_id"])
                if stop is not None:  # a module not installed: alone they would fail the same way (execute)
                    raise stop from e
                progress.event(f"group of {len(runs)} runs did not finish ({type(e).__name__}: {str(e)[:200]}); "
                               f"training them one by one")
        code, preempted = 0, "(preempted: rerun the command to resume)"
        for i, run in enumerate(runs):
            if code == 3:  # a signal stopped the run before: the rest stay pending for the next command
                progress.finished(run, None, preempted)
                continue
            if summaries is None:
                row, code = execute.train_run(workdir, run, doc["mode"], verbose, doc["sweep"].get("max_retries", 0))
            else:
                row, code = execute.record(workdir, run, summaries[i], doc["mode"])
            progress.finished(run, row, preempted if code == 3 else "")
            code = 3 if code == 3 else 0
        return code
    finally:
        for _, c in held:
            c.release()
