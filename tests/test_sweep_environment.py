"""A run that fails for want of something in the environment no retry can fix (issue 30: on the H100 the machine
lacked `portpicker` and `tensorboardX`, and every run of the sweep failed so, each retried: 12 runs × 2 attempts).
The sweep stops at the first one with one `error:` line naming the module and what to do, exit 2, the run left
unrecorded so that the command rerun after the fix trains it; in process, in a worker, in a group and in a SLURM
step alike (transformer/sweeps/execute.py decides it once)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from configs.sweeps import quick
from transformer.design import plan
from transformer.sweeps import claims, execute, results, run_groups, runner, slurm_jobs
from transformer.sweeps.progress import Progress

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _doc(workdir: str, n: int = 3, **sweep) -> dict:
    c = quick.get_config()
    c.sweep.update(sweep)
    p = plan.design(c)
    doc = runner.sweep_document(c, plan.Plan(p.runs[:n], p.notes))
    runner.write_sweep(workdir, doc)
    return doc


def _missing(name: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_what_no_retry_fixes_is_an_environment_failure_and_what_may_pass_is_not():
    stop = execute.environment_failure(_missing("portpicker"), "d8-L2")
    assert isinstance(stop, execute.EnvironmentFailure) and str(stop).startswith(
        "run d8-L2 could not train: the Python module 'portpicker' is not installed (No module named 'portpicker'); "
        "install the package that provides it (e.g. pip install portpicker; on the lent GPU machine "
        ".ci/gpu_wheels.sh")
    assert "the rerun trains it" in str(stop)
    try:  # raised while handling it, or from it (grain's data pipeline, the metrics writer): found in the chain
        try:
            raise _missing("tensorboardX.writer")
        except ModuleNotFoundError as e:
            raise RuntimeError("the writer could not start") from e
    except RuntimeError as e:
        assert "the Python module 'tensorboardX.writer' is not installed" in str(execute.environment_failure(e, "r"))
    cuda = "libcudnn.so.9: cannot open shared object file: No such file or directory"
    assert "a shared library is missing" in str(execute.environment_failure(ImportError(cuda), "r"))
    assert "a shared library is missing" in str(execute.environment_failure(OSError(cuda), "r"))
    version = ImportError("cannot import name 'tree' from 'optax'", name="optax")
    assert "install the version of optax pyproject.toml names" in str(execute.environment_failure(version, "r"))
    # this project's own import failing is a bug (its traceback kept); the XLA runtime's errors are retried
    assert execute.environment_failure(_missing("transformer.training.nowhere"), "r") is None
    assert execute.environment_failure(ImportError("cannot import name 'x'", name="experiments.cli"), "r") is None
    assert execute.environment_failure(RuntimeError("INTERNAL: ptxas exited with non-zero error code 15"), "r") is None
    assert execute.environment_failure(ValueError("bad"), "r") is None


def test_in_process_the_sweep_stops_at_the_first_run_unrecorded_and_the_rerun_trains_it(tmp_path, monkeypatch):
    from transformer.training import loop

    calls = []

    def lacking(config, workdir, verbose=False, **options):
        calls.append(workdir)
        raise _missing("portpicker")

    monkeypatch.setattr(loop, "train", lacking)
    workdir = str(tmp_path)
    doc = _doc(workdir, max_retries=2)
    with pytest.raises(execute.EnvironmentFailure, match=f"run {doc['runs'][0]['run_id']} could not train: the "
                                                         "Python module 'portpicker' is not installed"):
        runner.run_in_process(workdir, doc)
    assert len(calls) == 1  # not retried, and no later run tried
    assert results.read_results(workdir) == [] and not os.listdir(tmp_path / "claims")

    def fixed(config, workdir, verbose=False, **options):
        return {"status": "ok", "wall_seconds": 1.0, "eval_loss": 3.0, "train_loss": 3.1}

    monkeypatch.setattr(loop, "train", fixed)  # installed: the same command trains every run
    assert runner.run_in_process(workdir, doc) == 0
    assert [r["status"] for r in execute.read_rows(workdir)] == ["ok"] * 3


def test_a_group_stops_too_without_training_its_runs_one_by_one(tmp_path, monkeypatch):
    from transformer.training import loop

    def lacking(*args, **kwargs):
        raise _missing("tensorboardX")

    alone = []
    monkeypatch.setattr(loop, "train_runs", lacking)
    monkeypatch.setattr(loop, "train", lambda *a, **k: alone.append(a) or {"status": "ok"})
    workdir = str(tmp_path)
    doc = _doc(workdir, 2, multirun=True)
    with pytest.raises(execute.EnvironmentFailure, match="the Python module 'tensorboardX' is not installed"):
        run_groups.train_group_runs(workdir, doc, doc["runs"], Progress(doc["runs"], {}, settings=doc["sweep"]))
    assert alone == [] and results.read_results(workdir) == [] and not os.listdir(tmp_path / "claims")


_BLOCK = """
import sys
class _Lacking:  # the machine lacks tensorboardX (the metrics writer imports it when a run starts)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tensorboardX":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Lacking())
"""


def test_workers_stop_the_sweep_with_one_error_line_and_the_rerun_would_train_the_runs(tmp_path, corpus_dir):
    """`python -m experiments.sweep --parallel=2` on a machine without tensorboardX: the first worker's error is the
    command's one `error:` line, exit 2, no run recorded or claimed; the dry run of the same command says every run
    would train."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_BLOCK)
    workdir = str(tmp_path / "sweep")
    cmd = [sys.executable, "-m", "experiments.sweep", "--config=configs/sweeps/quick.py", f"--workdir={workdir}",
           "--config.sweep.budgets=1e9", "--config.sweep.sizes_per_budget=3", "--config.sweep.min_steps=5",
           "--config.sweep.size_span=8.0", "--config.sweep.prior_tokens_per_param=2.0", "--config.sweep.recenter=False",
           "--config.sweep.validate_ratio=0", "--config.base.data.seq_len=32", "--config.base.train.batch_size=8",
           f"--config.base.data.data_dir={corpus_dir}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), REPO]), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([*cmd, "--parallel=2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stdout[-2000:] + out.stderr[-3000:]
    assert "the Python module 'tensorboardX' is not installed" in errors[0] and "the rerun trains it" in errors[0]
    assert "Traceback" not in out.stderr
    assert results.read_results(workdir) == [] and not os.listdir(os.path.join(workdir, "claims"))
    runs = json.load(open(os.path.join(workdir, "sweep.json")))["runs"]
    del env["PYTHONPATH"]
    again = subprocess.run([*cmd, "--dry_run"], cwd=REPO, env={**env, "PYTHONPATH": REPO}, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0 and f"{len(runs)} runs would train now" in again.stdout, again.stderr[-2000:]


def test_a_slurm_task_stopped_so_stops_the_step_once_and_its_run_is_submitted_again(tmp_path, monkeypatch):
    workdir = str(tmp_path)
    doc = _doc(workdir, 2)
    os.makedirs(slurm_jobs.slurm_dir(workdir))
    slurm_jobs._append(workdir, {"stage": 1, "arrays": {"55": [0, 1]}, "driver": None, "time": 0.0,
                                 "run_ids": {"0": doc["runs"][0]["run_id"], "1": doc["runs"][1]["run_id"]}})
    message = f"run {doc['runs'][0]['run_id']} could not train: the Python module 'portpicker' is not installed"
    for i in (0, 1):
        with open(os.path.join(slurm_jobs.slurm_dir(workdir), f"55_{i}.out"), "w") as f:
            f.write(f"sweep-task: 55_{i} starts on n1 at x\nerror: {message}\n"
                    f"sweep-task: exit {execute.ENVIRONMENT_EXIT} in worker (task 55_{i}, attempt 1)\n")
    monkeypatch.setattr(slurm_jobs.slurm_query, "ended_tasks", lambda arrays: {})
    with pytest.raises(execute.EnvironmentFailure) as stopped:
        slurm_jobs.reconcile(workdir, doc)
    assert str(stopped.value) == message and results.read_results(workdir) == []
    # the command rerun after the fix: nothing recorded, the runs are submitted again
    assert slurm_jobs.reconcile(workdir, doc) == [] and results.read_results(workdir) == []
    assert not claims.held(workdir, doc["runs"][0]["run_id"], 600.0)
