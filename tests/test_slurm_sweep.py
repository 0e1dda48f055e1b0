"""Sweeps on a real SLURM scheduler (a one-node cluster on localhost: .ci/slurm_localhost.sh, which .ci/run starts):
one command carries a staged sweep to its fit and validation through driver jobs, a cancelled task and a task
signalled before its time limit resume from their checkpoints, a second command submits nothing twice, a bad
override and impossible requests are refused before submitting, and a failing setup line is recorded and
stops the sweep until --retry_failed. Marked `slurm`; skipped where `sbatch` is absent."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from slurm_cluster import skip_without_cluster

from transformer.sweeps import results
from xla_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [pytest.mark.slurm, skip_without_cluster()]

# One budget of 3 sizes, then the validation run: 2 stages, a few seconds of training per run
TINY = ["--config.sweep.budgets=1e9", "--config.sweep.sizes_per_budget=3", "--config.sweep.min_steps=5",
        "--config.sweep.size_span=8.0", "--config.sweep.prior_tokens_per_param=2.0", "--config.sweep.evals_per_run=4",
        "--config.sweep.checkpoints_per_run=4", "--config.base.data.seq_len=32", "--config.base.train.batch_size=8",
        "--config.base.train.eval_steps=1", "--config.sweep.validate_flops=3e9",
        "--config.sweep.slurm.gpus_per_task=0", "--config.sweep.slurm.cpus_per_task=1"]


def _env(corpus_dir: str) -> dict[str, str]:
    env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu",
               TFDS_DATA_DIR=corpus_dir)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    for k in [k for k in env if k.startswith("SLURM_")]:  # a test run inside a SLURM job is not a task
        del env[k]
    return env


def _cmd(workdir: str, corpus_dir: str, *extra: str, tiny: list[str] = TINY) -> list[str]:
    return [sys.executable, "-m", "experiments.sweep", "--config=configs/sweeps/quick.py", f"--workdir={workdir}",
            "--launcher=slurm", *tiny, f"--config.base.data.data_dir={corpus_dir}", *extra]


def _run(cmd: list[str], corpus_dir: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, env=_env(corpus_dir), capture_output=True, text=True, timeout=timeout)


def _jobs(workdir: str) -> list[dict]:
    path = os.path.join(workdir, "slurm", "jobs.jsonl")
    return [json.loads(line) for line in open(path)] if os.path.exists(path) else []


def _prediction(workdir: str) -> None:
    """A prediction on file before the grid trains (outcome.predict never rewrites one): the sweep designs its
    validation run from it; a fit of one budget could not predict, and 3 budgets would take minutes."""
    os.makedirs(os.path.join(workdir, "fit"))
    with open(os.path.join(workdir, "fit", "predictions.json"), "w") as f:
        json.dump({"flops": 3e9, "params": 12000, "tokens": 40000, "loss": 3.0, "loss_ci95": [2.5, 3.5],
                   "convention": "total", "written_at": "2026-01-01T00:00:00+00:00"}, f)


def _scancel_all(workdir: str) -> None:
    ids = [j for s in _jobs(workdir) for j in [*s.get("arrays", {}), *([s["driver"]] if s.get("driver") else [])]]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


def _checkpointed_task(workdir: str, array: str, index: int, run_id: str) -> bool:
    """Task ARRAY_INDEX is running and its run has a checkpoint (so an interruption loses nothing)."""
    ckpt = os.path.join(workdir, "runs", run_id, "checkpoints")
    q = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True, text=True).stdout
    return f"{array}_{index} RUNNING" in q and os.path.isdir(ckpt) and any(d.isdigit() for d in os.listdir(ckpt))


def test_one_command_carries_a_staged_sweep_through_cancel_requeue_and_a_duplicate_to_its_validation(
        tmp_path, corpus_dir):
    workdir = str(tmp_path / "s")
    _prediction(workdir)
    # a checkpoint every ~4 of the runs' ~53 steps: the first comes early, so the USR1 sent once it exists meets a
    # run with most of its steps (and their checkpoint writes) still to go; with 4 per run the signal could land
    # after the last step on a quiet machine, and the run finished without requeueing
    tiny = [a for a in TINY if not a.startswith("--config.sweep.checkpoints_per_run=")] + [
        "--config.sweep.checkpoints_per_run=12"]
    proc = subprocess.Popen(_cmd(workdir, corpus_dir, "--wait", tiny=tiny), cwd=REPO, env=_env(corpus_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 480
        while time.time() < deadline and len(_jobs(workdir)) < 2:  # stage 1 and its driver
            time.sleep(0.2)
        first = _jobs(workdir)[0]
        (array, indices), = first["arrays"].items()
        assert first["driver"] is None and len(indices) == 3
        # a second command while the stage runs: it names the queued jobs and submits nothing
        again = subprocess.Popen(_cmd(workdir, corpus_dir, tiny=tiny), cwd=REPO, env=_env(corpus_dir), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        # interrupt both tasks once each has a checkpoint: scancel one; send the other the time-limit signal
        todo = {"scancel": indices[0], "USR1": indices[1]}
        while todo and time.time() < deadline and proc.poll() is None:
            for how, i in list(todo.items()):
                if _checkpointed_task(workdir, array, i, first["run_ids"][str(i)]):
                    subprocess.run(["scancel", f"{array}_{i}"] if how == "scancel" else
                                   ["scancel", "--signal=USR1", f"{array}_{i}"], check=True)
                    del todo[how]
            time.sleep(0.1)
        assert not todo, "the tasks did not reach a checkpoint in time"
        again_out = again.communicate(timeout=300)[0]
        assert again.returncode == 0 and "nothing submitted again" in again_out, again_out  # (3 stages below)
        out = proc.communicate(timeout=600)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        _scancel_all(workdir)
    assert proc.returncode == 0, out[-4000:]
    rows = results.read_results(workdir)
    assert sorted(r["role"] for r in rows) == ["grid", "grid", "grid", "validate"] and all(r["status"] == "ok" for r in rows)
    validation = json.load(open(os.path.join(workdir, "fit", "validation.json")))
    assert validation["measured_loss"] is not None and os.path.exists(os.path.join(workdir, "fit", "fit.json"))
    subs = [s for s in _jobs(workdir) if s.get("arrays")]
    cancelled_run = first["run_ids"][str(indices[0])]
    # the cancelled task was submitted again by the driver and resumed from its checkpoint
    again_sub = next(s for s in subs[1:] if cancelled_run in s["run_ids"].values())
    (array2, idx2), = again_sub["arrays"].items()
    log2 = open(os.path.join(workdir, "slurm", f"{array2}_{idx2[0]}.out")).read()
    assert re.search(r"resuming from step [1-9]", log2), log2
    # the signalled task checkpointed, requeued itself, and its second attempt appended to the same log
    log = open(os.path.join(workdir, "slurm", f"{array}_{indices[1]}.out")).read()
    assert "requeued SLURM task" in log and "attempt 2" in log and re.search(r"resuming from step [1-9]", log), log
    assert log.count("starts on") == 2
    # one command: stage 1, the cancelled run again, the validation run; each followed by its driver job
    assert len(subs) == 3 and all(s.get("driver") for s in _jobs(workdir) if not s.get("arrays"))
    assert "fit ->" in out and "every run of" in out
    assert "PENDING (Dependency)" in out  # --wait shows the queue and why jobs pend


def _config(*overrides: str):
    """The sweep config of _cmd's command line (TINY and `overrides`), built in this process."""
    from configs.sweeps import quick

    c = quick.get_config()
    for arg in [*TINY, *overrides]:
        path, value = arg.removeprefix("--config.").split("=", 1)
        *parents, key = path.split(".")
        node = c
        for p in parents:
            node = node[p]
        old = node[key]
        node[key] = (tuple(float(v) for v in value.split(",")) if isinstance(old, tuple) else
                     type(old)(value) if isinstance(old, (int, float)) and not isinstance(old, bool) else value)
    return c


def test_refused_before_submitting_bad_override_impossible_request_and_sbatch_error(tmp_path, corpus_dir, monkeypatch):
    """Each refusal is one `error:` line (the CLI's ConfigError) before anything is submitted or written."""
    from transformer.spec import ConfigError
    from transformer.sweeps import slurm_jobs

    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)
    for n, (override, words) in enumerate([
            ("--config.base.data.tfds_name=nosuch", "data.tfds_name='nosuch'"),  # every task would fail on it
            ("--config.sweep.slurm.sbatch_options=--gres=gpu:1", "generic resource")]):  # sbatch's own refusal
        workdir = str(tmp_path / f"cli{n}")
        out = _run(_cmd(workdir, corpus_dir, override), corpus_dir)
        err = [ln for ln in out.stderr.splitlines() if ln.strip()]
        assert out.returncode == 2 and len(err) == 1 and err[0].startswith("error: ") and words in err[0], (
            override, out.stdout, out.stderr)
    assert "sbatch refused" in err[0] and "gpus_per_task=0" in err[0]  # with the advice for a CPU partition
    assert not os.path.exists(os.path.join(str(tmp_path / "cli0"), "sweep.json")) and not _jobs(str(tmp_path / "cli0"))
    for n, (override, words) in enumerate([
            ("--config.base.model.positional=bogus", "model.positional='bogus'"),  # every task would fail on it
            ("--config.sweep.slurm.cpus_per_task=64", "cpus_per_task=64"),  # would pend forever
            ("--config.sweep.slurm.gpus_per_task=1", "gpus_per_task=0")]):  # the GPU default on a CPU partition
        workdir = str(tmp_path / f"s{n}")
        with pytest.raises(ConfigError, match=re.escape(words)):
            slurm_jobs.step(workdir, _config(f"--config.base.data.data_dir={corpus_dir}", override), ["true"], REPO)
        # nothing submitted, nor written: the fixed command may use the same --workdir
        assert not os.path.exists(os.path.join(workdir, "sweep.json")) and not _jobs(workdir), override


@pytest.mark.slow  # 26 s on 2 cores; the one-command sweep above stays in the default run
def test_a_failing_setup_line_is_recorded_and_stops_the_sweep_until_retry_failed(tmp_path, corpus_dir):
    workdir = str(tmp_path / "s")
    bad = "--config.sweep.slurm.setup=no_such_module_command"
    try:
        out = _run(_cmd(workdir, corpus_dir, bad, "--wait"), corpus_dir)
        assert out.returncode == 1, out.stdout + out.stderr
        rows = results.read_results(workdir)
        assert len(rows) == 3 and all(r["status"] == "failed" for r in rows)
        assert all("exit 127" in r["error"] and "no_such_module_command" in r["error"] and "setup" in r["error"]
                   for r in rows), rows[0]["error"]
        assert "stopped: 3 runs failed" in out.stdout and "--retry_failed" in out.stdout
        assert len([s for s in _jobs(workdir) if s.get("arrays")]) == 1  # the driver recorded them and stopped
        again = _run(_cmd(workdir, corpus_dir, bad), corpus_dir)  # not resubmitted forever
        assert again.returncode == 1 and "stopped" in again.stdout
        assert len([s for s in _jobs(workdir) if s.get("arrays")]) == 1
        fixed = _run(_cmd(workdir, corpus_dir, "--config.sweep.slurm.setup=true", "--retry_failed"), corpus_dir)
        assert fixed.returncode == 0 and "retrying 3 failed runs" in fixed.stdout, fixed.stdout + fixed.stderr
        subs = [s for s in _jobs(workdir) if s.get("arrays")]
        assert len(subs) == 2 and sorted(subs[1]["run_ids"].values()) == sorted(r["run_id"] for r in rows)
        script = open(os.path.join(workdir, "slurm", "stage2.sbatch")).read()
        assert "no_such_module_command" not in script and "\ntrue\n" in script
        driver = open(os.path.join(workdir, "slurm", "stage2-driver.sbatch")).read()
        assert "--retry_failed" not in driver  # the driver's rerun would drop failed rows at every stage
    finally:
        _scancel_all(workdir)


@pytest.mark.slow
def test_at_its_time_limit_a_task_checkpoints_requeues_itself_and_resumes(tmp_path, corpus_dir):
    """The real time limit (not a signal sent by hand): --time=3 min, USR1 90 s before it (SLURM sends it up to
    60 s early), runs of 2-3 minutes on a quiet 2-core machine (budget 2e12 with 20 prior tokens per parameter, so
    the sizes stay on the tiny ladder and train longer; at 2e10 the runs took 12 s there and ended before the
    signal). A few minutes; marked slow as well as slurm."""
    workdir = str(tmp_path / "s")
    longer = [a for a in TINY if not a.startswith(("--config.sweep.budgets=", "--config.sweep.validate_flops="))]
    out = _run(_cmd(workdir, corpus_dir, "--config.sweep.budgets=2e12", "--config.sweep.validate_flops=8e12",
                    "--config.sweep.prior_tokens_per_param=20.0",
                    "--config.sweep.slurm.time=00:03:00", "--config.sweep.slurm.signal_seconds=90", tiny=longer),
               corpus_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    resumed = re.compile(r"received signal 10: checkpointed step \d+.*\n(.*\n)*.*requeued SLURM task(.*\n)*"
                         r".* starts on (.*\n)*.*resuming from step [1-9]")
    try:
        (array, indices), = _jobs(workdir)[0]["arrays"].items()
        logs = [os.path.join(workdir, "slurm", f"{array}_{i}.out") for i in indices]
        deadline, found = time.time() + 840, None
        while time.time() < deadline and found is None:
            time.sleep(2)
            found = next((p for p in logs if os.path.exists(p) and resumed.search(open(p).read())), None)
        assert found, "\n\n".join(open(p).read()[-3000:] for p in logs if os.path.exists(p))
    finally:
        _scancel_all(workdir)
