"""Run a sweep: python -m experiments.sweep --config=configs/sweeps/NAME.py --workdir=DIR
    [--parallel=K] [--launcher=local|slurm [--wait]] [--dry_run] [--retry_failed] [--stages=N] [--verbose]
    [--config.KEY=V ...]

Expands the sweep config into runs (transformer/design/grid.py), writes DIR/sweep.json, trains every
run not yet in DIR/results.jsonl (by default on GPUs in as many worker processes per GPU as fit, without a GPU in
this process; --parallel=K: K worker processes, 1: this process; or with --launcher=slurm a job array per stage
and a driver job that reruns this command after it: docs/clusters.md), then fits: DIR/fit/ for IsoFLOP sweeps,
DIR/lr_fit.json for LR scans.
Rerunning the command skips finished runs and resumes interrupted ones; a DIR holding a sweep designed with
other settings is refused. --stages=N trains at most N more stages, then stops and says what remains. --dry_run
says what the command would do now (the same planning path, transformer/sweeps/next_stage.py: the runs recorded,
the stage designed from them, what would train, the time left; with --launcher=slurm, the job script) and writes
nothing.

Worker mode (what --parallel and SLURM array tasks run): --workdir=DIR --run_index=I trains run I of
DIR/sweep.json and records it (--run_index=I,J,...: a sweep.multirun group as one program); --fit_when_done also
fits when it was the last one.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import sys

from absl import flags, logging
from ml_collections import config_flags

from experiments import cli
from experiments._paths import absolute_config
from experiments.jax_setup import setup_jax
from transformer import file_claims
from transformer.data import identity
from transformer.design.spec import SweepSpec
from transformer.sweeps import execute, next_stage, outcome, packing, progress, runner, slurm, slurm_jobs
from transformer.sweeps.results import RecordError
from transformer.spec import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Sweep config, e.g. configs/sweeps/quick.py.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory: sweep.json, results.jsonl, runs/, fit/.")
_PARALLEL = flags.DEFINE_integer("parallel", 0, "Worker processes training at once; 1: one run at a time in this "
                                 "process; 0: the sweep chooses (on GPUs, as many workers per GPU as fit: "
                                 "sweep.workers_per_device; without a GPU, 1).")
_LAUNCHER = flags.DEFINE_enum("launcher", "local", ["local", "slurm"], "Where the runs execute.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the runs and the time estimate (or the sbatch script); "
                             "write nothing.")
_RETRY = flags.DEFINE_bool("retry_failed", False, "Run the runs recorded as failed again.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show each run's own training progress.")
_RUN_INDEX = flags.DEFINE_list("run_index", None, "Worker mode: train run I of DIR/sweep.json (I,J,...: a "
                               "sweep.multirun group, as one program).")
_FIT_WHEN_DONE = flags.DEFINE_bool("fit_when_done", False, "Worker mode: fit when every run is recorded.")
_WAIT = flags.DEFINE_bool("wait", False, "--launcher=slurm: follow the sweep's jobs stage by stage to its fit.")
_STAGES = flags.DEFINE_integer("stages", None, "Train at most this many more stages of the plan, then stop (exit 0) "
                               "and say what remains; rerun the command to go on. Default: to the end.")

def _indices(values: list[str], total: int) -> list[int]:
    try:
        indices = [int(v) for v in values]
    except ValueError:
        indices = []
    if not indices or len(set(indices)) != len(indices) or not all(0 <= i < total for i in indices):
        raise ConfigError(f"--run_index={','.join(values)} must be run indices (I, or I,J,... for a group), each in "
                          f"0..{total - 1}: the workdir's sweep.json has {total} runs")
    return indices


@contextlib.contextmanager
def _stops_the_sweep(run_ids: str):
    """Worker mode: an environment failure (execute.environment_failure: a module not installed, in the set-up or
    the training) is this process's `error:` line and exit execute.ENVIRONMENT_EXIT, which the runner and the
    SLURM step turn into the sweep's one error; the run is not recorded."""
    try:
        yield
    except Exception as e:
        stop = e if isinstance(e, execute.EnvironmentFailure) else execute.environment_failure(e, run_ids)
        if stop is None:
            raise
        print(f"error: {stop}", file=sys.stderr, flush=True)
        raise SystemExit(execute.ENVIRONMENT_EXIT) from None


def _worker(workdir: str, values: list[str]) -> None:
    doc = runner.load_sweep(workdir)
    indices = _indices(values, len(doc["runs"]))
    with _stops_the_sweep(", ".join(doc["runs"][i]["run_id"] for i in indices)):
        if len(indices) > 1:
            return _group_worker(workdir, doc, [doc["runs"][i] for i in indices])
        return _run_worker(workdir, doc, doc["runs"][indices[0]])


def _run_worker(workdir: str, doc: dict, run: dict) -> None:
    """Worker mode for one run: claimed, trained and recorded (runner.train_run); exit 3 when preempted,
    CLAIMED_ELSEWHERE when another runner holds it, 1 when it failed."""
    code = 0
    if run["run_id"] in {r["run_id"] for r in runner.results.read_results(workdir)}:
        print(f"{run['run_id']} is already recorded; nothing to do", flush=True)
    else:
        import ml_collections
        held = runner.claim(workdir, doc, run)
        if held is None:
            print(f"{run['run_id']} is claimed by another runner; nothing to do", flush=True)
            raise SystemExit(runner.CLAIMED_ELSEWHERE)
        with held:
            setup_jax(ml_collections.ConfigDict(run["config"]))
            requeue_signal = slurm.arm_requeue()  # a SLURM task: checkpoint and requeue itself before its time limit
            import transformer.interop.hf_warm_start  # noqa: F401  train.init_from may name a Hugging Face checkpoint
            try:
                row, code = runner.train_run(workdir, run, doc["mode"], verbose=True,
                                             max_retries=doc["sweep"].get("max_retries", 0))
            except RecordError as e:  # the run's directory keeps its result: recorded by the next command
                print(f"error: {e}", file=sys.stderr, flush=True)
                raise SystemExit(1)
        print(f"{run['run_id']}: {row['status'] if row else 'preempted'}", flush=True)
        if code == 3 and slurm.requeue_if_signalled(requeue_signal):
            raise SystemExit(3)
    if _FIT_WHEN_DONE.value and code != 3:
        outcome.finish_once(workdir, doc)
    if code:
        raise SystemExit(code)


def _group_worker(workdir: str, doc: dict, group: list[dict]) -> None:
    """Worker mode for a sweep.multirun group (the runner's unit of work): its runs not yet recorded trained as one
    program (run_groups.train_group_runs: claimed one by one, each recorded); exit 3 when preempted,
    CLAIMED_ELSEWHERE when another runner holds every one of them."""
    import ml_collections

    from transformer.sweeps import run_groups

    recorded = {r["run_id"] for r in runner.results.read_results(workdir)}
    todo = [r for r in group if r["run_id"] not in recorded]
    if not todo:
        print(f"{', '.join(r['run_id'] for r in group)}: already recorded; nothing to do", flush=True)
        return
    if all(runner.claims.held(workdir, r["run_id"], doc["sweep"].get("claim_timeout_s", 600.0)) for r in todo):
        print(f"{', '.join(r['run_id'] for r in todo)}: claimed by other runners; nothing to do", flush=True)
        raise SystemExit(runner.CLAIMED_ELSEWHERE)
    setup_jax(ml_collections.ConfigDict(todo[0]["config"]))
    import transformer.interop.hf_warm_start  # noqa: F401  (as a single run's worker)
    try:
        lines = progress.Progress(doc["runs"], {}, settings=doc["sweep"])
        code = run_groups.train_group_runs(workdir, doc, todo, lines, verbose=True)
    except RecordError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    if code:
        raise SystemExit(code)


def _dry_run(workdir: str, config, parallel: int) -> None:
    """What the command would do now, from the same planning path (next_stage) without writing: the same refusals
    (another sweep's DIR), the runs recorded, the stage designed from them, the prediction, what would train. Where
    the sweep chooses (--parallel=0) and no GPU is visible, the estimate packs the runs on the GPU
    sweep.estimate_device_memory_gb assumes."""
    from transformer.design import plan

    sched, slots_for, assumed = runner.schedule(config.settings(), parallel, assume=_PARALLEL.value == 0)
    ns = next_stage.next_stage(workdir, config, write=False, retry_failed=_RETRY.value, schedule=sched)
    if _LAUNCHER.value == "slurm":  # the script the command would submit now: the runs of this stage that are ready
        ready = runner.ready_to_submit(workdir, ns.doc, ns.rows)
        if ready:
            print(slurm.slurm_script(workdir, ns.doc, ready), end="")
        elif ns.plan.waiting == "prediction":
            print(f"# nothing to submit yet: the command first fits the recorded grid and writes {workdir}/fit/"
                  f"predictions.json, then submits the validation run designed from it")
        else:
            print(f"# nothing to submit: " + (f"every run of {workdir} is recorded; the command fits" if not ns.todo
                                              else "the pending runs wait for runs not yet recorded"))
        return
    later = next_stage.later_runs(plan.design(config, preview=True, schedule=sched), ns.doc)
    fitted = not ns.todo and os.path.isdir(workdir) and outcome.current_fit(workdir, ns.doc) is not None
    progress.print_dry_run(workdir, ns, later, slots_for, fitted, assumed, sched)


def main(argv: list[str]) -> None:
    del argv
    if not _VERBOSE.value:
        logging.set_verbosity(logging.WARNING)  # checkpointing and dataset INFO lines drown the progress
    workdir = os.path.abspath(_WORKDIR.value)
    if _RUN_INDEX.value:
        return _worker(workdir, _RUN_INDEX.value)
    if _CONFIG.value is None:
        raise ConfigError("--config is required (e.g. --config=configs/sweeps/quick.py), except with --run_index")
    if _PARALLEL.value < 0:
        raise ConfigError(f"--parallel={_PARALLEL.value} must be 0 (the sweep chooses) or a number of workers")
    # relative data files, tokenizer, grid_from: from this directory; then the sweep's settings, checked once
    config = SweepSpec.of(absolute_config(_CONFIG.value))  # (design/spec.py)
    if _STAGES.value is not None and (_STAGES.value < 1 or _LAUNCHER.value == "slurm"):
        raise ConfigError(f"--stages={_STAGES.value} must be a positive number of stages, with --launcher=local (a "
                          f"SLURM sweep goes on stage by stage through its driver jobs: leave --stages out)")
    if config.multirun and _LAUNCHER.value == "slurm":
        raise ConfigError("sweep.multirun=True trains groups of runs as one program in one process (or one local "
                          "worker), not as SLURM array tasks: use --launcher=local or sweep.multirun=False")
    identity.check_data(config.base["data"])  # once, before designing or launching anything (a bad glob: exit 2)
    parallel = _PARALLEL.value or (0 if packing.visible_gpus() else 1)  # the sweep chooses: no GPU, this process
    if _DRY_RUN.value:
        return _dry_run(workdir, config, parallel)
    if _LAUNCHER.value == "slurm":
        return _slurm(workdir, config)
    runner.check_slots(config, parallel)  # a GPU share too small for a run: refused before anything trains
    try:
        if parallel == 1:
            setup_jax(_CONFIG.value.base)
            import transformer.interop.hf_warm_start  # noqa: F401  train.init_from may name a Hugging Face checkpoint
        # --retry_failed: failed, not diverged (an observation: it would diverge again)
        code, doc = runner.run_sweep(workdir, config, parallel, _VERBOSE.value, retry_failed=_RETRY.value,
                                     stages=_STAGES.value)
    except RecordError as e:  # a full disk: the finished runs' directories keep their results for the rerun
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    for note in doc["notes"]:
        print(f"note: {note}", flush=True)
    if code == runner.STOPPED:  # doc: the next stage as designed now (nothing of it written)
        from transformer.design import plan
        todo, _ = runner.pending_runs(workdir, doc["runs"])
        later = next_stage.later_runs(plan.design(config, preview=True,
                                                  schedule=runner.schedule(config.settings(), parallel)[0]), doc)
        left = progress.remaining(todo, later, doc["waiting"])
        again = " ".join(shlex.quote(a) for a in _without(sys.argv[1:], _CONTINUE))
        print(f"stopped after {_STAGES.value} stage{'s' if _STAGES.value > 1 else ''} (--stages={_STAGES.value}); "
              f"remaining: {left}; go on with: python -m experiments.sweep {again} "
              f"(--stages=N for N more stages; --dry_run shows the next one)", flush=True)
        return
    if code == runner.OTHER_RUNNERS:  # the rest is being trained by other runners on this DIR
        print(f"some runs are claimed by other runners on {workdir}; the last runner to finish fits", flush=True)
        return
    if code:
        raise SystemExit(code)
    rows = execute.read_rows(workdir)
    failed = [r["run_id"] for r in rows if r["status"] == execute.FAILED]
    for r in rows:  # an observation, not a failure: reported, left out of the fit
        if r["status"] == execute.DIVERGED and r.get("role", "grid") != "lr":
            print(f"warning: {r['run_id']} diverged ({r.get('error')}); left out of the fit", file=sys.stderr)
    try:
        fit = outcome.current_fit(workdir, doc)  # the rows it was made from, unchanged: printed, nothing written
        if fit is None:
            with file_claims.hold(os.path.join(workdir, "fit.claim")):  # runners finishing together: one at a time
                fit = outcome.finish(workdir, doc, announce=False)
    except Exception as e:  # the runs are safe in results.jsonl; the fit can be redone on its own
        again = ("python -m experiments.fit --sweep=" + workdir + " --out=" + os.path.join(workdir, "fit")
                 if doc["mode"] == "isoflop" else "this command")
        print(f"error: the fit failed ({type(e).__name__}: {e}); all runs are recorded in {workdir}/results.jsonl; "
              f"fit again with {again}", file=sys.stderr)
        raise SystemExit(1)
    _report_fit(doc["mode"], fit, workdir, rows)
    if failed:
        print(f"{len(failed)} runs failed ({', '.join(failed)}); see their rows in {workdir}/results.jsonl; "
              f"--retry_failed runs them again", file=sys.stderr)
        raise SystemExit(1)


_ONCE = re.compile(r"^--(no)?(wait|retry_failed)(=.*)?$")  # what a driver job's rerun of the command leaves out
_CONTINUE = re.compile(r"^--(no)?(stages|retry_failed)(=.*)?$")  # what the command that goes on leaves out


def _without(args: list[str], flags_re: re.Pattern) -> list[str]:
    """`args` without the flags `flags_re` matches (and the value after one given as `--stages N`)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif flags_re.match(a):
            skip = a in ("--stages",)
        else:
            out.append(a)
    return out


def _slurm(workdir: str, config) -> None:
    """--launcher=slurm: one step (slurm_jobs.step: submit the next stage and a driver job that reruns this
    command after it), or with --wait every step until the sweep is fitted; then the fit's report."""
    slurm.require_sbatch()
    command = [sys.executable, "-m", "experiments.sweep", *(a for a in sys.argv[1:] if not _ONCE.match(a))]
    retry = _RETRY.value
    while True:
        status, doc = slurm_jobs.step(workdir, config, command, os.getcwd(), retry)
        retry = False
        if status == "done":
            break
        if status in ("failed", "stuck"):
            raise SystemExit(1)
        if not _WAIT.value:
            if status == "submitted" and not os.environ.get("SLURM_JOB_ID"):  # not in a driver's log
                print(f"the driver jobs carry the sweep to its fit; follow it with --wait (or squeue, "
                      f"{workdir}/slurm/*.out); rerunning this command submits nothing twice", flush=True)
            return
        slurm_jobs.wait(workdir)
    for note in doc["notes"]:
        print(f"note: {note}", flush=True)
    fit = outcome.finish_once(workdir, doc)  # None: a task (--fit_when_done) or a driver fitted already
    path = os.path.join(workdir, "lr_fit.json" if doc["mode"] == "lr_scan" else os.path.join("fit", "fit.json"))
    if fit is None and os.path.exists(path):
        with open(path) as f:
            fit = json.load(f)
    if fit is not None:
        _report_fit(doc["mode"], fit, workdir, execute.read_rows(workdir))
    print(f"every run of {workdir} is recorded", flush=True)


def _report_fit(mode: str, fit: dict, workdir: str, rows: list[dict] = ()) -> None:
    if mode == "lr_scan":
        print(f"lr_opt = {fit['coefficient']:.4g} · N^{fit['exponent']:.3f} -> {workdir}/lr_fit.json")
        for w in fit["warnings"]:
            print(f"warning: {w}")
        return
    from transformer.scaling.report import summary
    print(summary(fit))
    for line in outcome.summary_lines(fit, rows):  # excluded points and why, estimates not credible, the check
        print(line)
    print(f"fit -> {workdir}/fit/ (N_opt ∝ C^a, D_opt ∝ C^b)")


if __name__ == "__main__":
    flags.mark_flags_as_required(["workdir"])
    cli.run(main)
