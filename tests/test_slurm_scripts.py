"""The SLURM job scripts of a sweep, without a scheduler: resources as the cluster wants them (--gres or --gpus,
qos, constraint, exclude, pass-through lines), per-run time limits from the plan's estimates, the self-requeue
signal and appended logs, the driver job's dependency and command; SLURM's time formats; a task log's end line."""
from __future__ import annotations

import math
import os
import signal

import pytest

from configs.sweeps import quick
from transformer.design import plan
from transformer.spec import ConfigError
from transformer.sweeps import runner, slurm, slurm_jobs


def _doc(**slurm_settings) -> dict:
    c = quick.get_config()
    c.sweep.slurm.update(slurm_settings)
    return runner.sweep_document(c, plan.design(c))


def _lines(script: str) -> list[str]:
    return [ln.removeprefix("#SBATCH ") for ln in script.splitlines() if ln.startswith("#SBATCH ")]


def test_resources_as_the_cluster_wants_them(tmp_path):
    doc = _doc(gpus_per_task=2, gpu_type="a100", qos="high", constraint="ib&v100", exclude="node[1-3]",
               sbatch_options="--reservation=r1 --mail-type=END", cpus_per_task=4, mem="32G", partition="gpu")
    lines = _lines(slurm.slurm_script(str(tmp_path), doc, [0, 1]))
    for want in ("--gres=gpu:a100:2", "--qos=high", "--constraint=ib&v100", "--exclude=node[1-3]",
                 "--reservation=r1", "--mail-type=END", "--cpus-per-task=4", "--mem=32G", "--partition=gpu",
                 "--open-mode=append", "--requeue", "--signal=USR1@120", f"--output={tmp_path}/slurm/%A_%a.out"):
        assert want in lines, (want, lines)
    doc = _doc(gpus_per_task=1, gpu_request="gpus")
    assert "--gpus=1" in _lines(slurm.slurm_script(str(tmp_path), doc, [0]))
    cpu = _lines(slurm.slurm_script(str(tmp_path), _doc(gpus_per_task=0), [0]))
    assert not [ln for ln in cpu if "gpu" in ln or "gres" in ln]
    with pytest.raises(ConfigError, match="gpu_request='tpu'"):
        slurm.slurm_script(str(tmp_path), _doc(gpu_request="tpu"), [0])


def test_time_limits_follow_each_runs_estimate():
    doc = _doc(time_factor=3.0)
    est = {r["index"]: r["estimated_seconds"] for r in doc["runs"]}
    for i, seconds in est.items():  # the limit covers 3x the estimate, and is at least 10 minutes
        minutes = slurm.minutes_of(slurm.time_limit(doc["runs"][i], doc["sweep"]["slurm"]))
        assert minutes >= max(10.0, 3 * seconds / 60)
    long_run = {**doc["runs"][0], "estimated_seconds": 20 * 3600.0}  # 60 h wanted: 3 days, or the partition's cap
    assert slurm.time_limit(long_run, doc["sweep"]["slurm"]) == "72:00:00"
    assert slurm.time_limit(long_run, doc["sweep"]["slurm"], cap_min=1440) == "24:00:00"
    fixed = _doc(time="02:00:00")
    assert slurm.time_limit(long_run, fixed["sweep"]["slurm"]) == "02:00:00"
    # runs grouped by limit: one array each, the longest first
    groups = slurm.array_groups("/d", {**doc, "runs": [doc["runs"][0], long_run | {"index": 1}]}, [0, 1])
    assert [g[1] for g in groups] == [[1], [0]] and "--array=1\n" in groups[0][2] and "--array=0\n" in groups[1][2]


def test_slurm_time_formats():
    assert [slurm.minutes_of(t) for t in ("30", "30:30", "01:00:00", "1-00", "1-02:30", "2-00:00:30")] == [
        30, 30.5, 60, 1440, 1590, 2880.5]
    assert slurm.minutes_of("UNLIMITED") == math.inf and slurm.minutes_of("soon") is None


def test_sinfo_gres_fields():
    assert slurm._gpus("gpu:a100:4(S:0-1),shard:8", "") == 4
    assert slurm._gpus("gpu:a100:4(S:0-1)", "v100") == 0 and slurm._gpus("gpu:v100:2", "v100") == 2
    assert slurm._gpus("(null)", "") == 0 and slurm._gpus("gpu:8", "") == 8


def test_the_driver_reruns_the_command_after_the_arrays(tmp_path):
    doc = _doc(setup="module load cuda", partition="cpu")
    script = slurm.driver_script(str(tmp_path), doc, ["12", "13"], ["python", "-m", "experiments.sweep",
                                                                     "--config.sweep.slurm.setup=a b"], "/home/me")
    lines = _lines(script)
    assert "--dependency=afterany:12:13" in lines and "--partition=cpu" in lines and "--cpus-per-task=1" in lines
    assert not [ln for ln in lines if "gres" in ln or "gpu" in ln]
    body = script.splitlines()
    assert body[-3:] == ["cd /home/me", "module load cuda",
                         "python -m experiments.sweep '--config.sweep.slurm.setup=a b'"]


def test_a_task_log_says_how_the_task_ended(tmp_path):
    """The job script's EXIT trap line (the last attempt's, after requeues) and the lines before it."""
    log = tmp_path / "12_0.out"
    log.write_text("sweep-task: 12_0 starts on n1 at x\nstep 5\nsweep-task: exit 3 in worker (task 12_0, attempt 1)\n"
                   "sweep-task: 12_0 starts on n2 at y\n/bin/bash: line 9: module: command not found\n"
                   "sweep-task: exit 127 in setup (task 12_0, attempt 2)\n")
    code, phase, tail = slurm_jobs._log_end(str(log))
    assert (code, phase) == (127, "setup") and tail == "/bin/bash: line 9: module: command not found"
    assert "setup lines" in slurm_jobs._classify(code, phase, None, tail, str(log))
    assert slurm_jobs._classify(3, "worker", None, "", "") is None  # preempted: submitted again
    assert slurm_jobs._classify(128 + signal.SIGTERM, "worker", None, "", "") is None
    assert "exited 1" in slurm_jobs._classify(1, "worker", None, "Traceback", "")
    assert slurm_jobs._classify(None, None, ("CANCELLED", 0), "", "") is None
    assert "out of memory" in slurm_jobs._classify(None, None, ("OUT_OF_MEMORY", 137), "", "")
    log.write_text("sweep-task: 12_0 starts on n1 at x\nstep 5\n")  # killed: no end line
    assert slurm_jobs._log_end(str(log))[:2] == (None, None)


def test_the_queue_summary_counts_unstarted_array_tasks():
    q = {"12_[3-5,7%2]": ("PENDING", "JobArrayTaskLimit"), "12_0": ("RUNNING", "None"),
         "14": ("PENDING", "PartitionTimeLimit")}
    assert slurm_jobs.describe(q) == ("job 12: 1 RUNNING, 4 PENDING (JobArrayTaskLimit); "
                                      "job 14: 1 PENDING (PartitionTimeLimit)")
    assert slurm_jobs.hopeless(q) == ["PartitionTimeLimit"]
