"""Several runs on one device at once (transformer/sweeps/packing.py, runner.run_parallel): how many workers share a
GPU and each one's memory fraction, on faked device lists; the scheduler with stand-in workers (a group as one
worker's unit, a run out of memory beside others trained again alone); the packed time estimate; and on the CPU
the same losses packed as alone."""
from __future__ import annotations

import json
import os

import pytest

from configs import lm
from transformer.design import plan
from transformer.spec import ConfigError
from transformer.sweeps import packing, progress, results, runner
from transformer.training.resolve import plain_config
from cli_modules import cli_module
from xla_env import xla_flags

GiB = 2**30
H100 = packing.Gpu("0", 80 * GiB)


def test_one_gpu_holds_as_many_workers_as_the_memory_estimates_allow():
    # k · (1.5 · 5 GiB + 1 GiB) ≤ 0.9 · 80 GiB: 8 workers of 5 GiB fit, and 8 is also the cap
    slots = packing.place(0, [H100], [5 * GiB] * 20, cores=16)
    assert len(slots) == 8 and {s.gpu for s in slots} == {H100} and {s.sharing for s in slots} == {8}
    assert slots[0].memory_fraction == pytest.approx((0.9 * 80 / 8 - 1) / 80)
    # a larger run leaves room for fewer: 0.9 · 80 / (1.5 · 20 + 1) = 2.3
    assert len(packing.place(0, [H100], [5 * GiB, 20 * GiB], cores=16)) == 2
    # never more workers than units, nor than one per two CPU cores
    assert len(packing.place(0, [H100], [GiB] * 3, cores=16)) == 3
    assert len(packing.place(0, [H100], [GiB] * 20, cores=6)) == 3
    # a unit larger than the GPU: one worker, with XLA's defaults (no fraction)
    alone = packing.place(0, [H100], [100 * GiB] * 4, cores=16)
    assert len(alone) == 1 and alone[0].memory_fraction is None
    # sweep.workers_per_device fixes the number
    assert len(packing.place(0, [H100], [GiB] * 20, workers_per_device=3, cores=16)) == 3
    # memory unknown (nvidia-smi did not say): one worker unless told
    assert len(packing.place(0, [packing.Gpu("0")], [GiB] * 20, cores=16)) == 1


def test_several_gpus_take_turns_and_each_worker_sees_its_own():
    gpus = [packing.Gpu("0", 80 * GiB), packing.Gpu("1", 80 * GiB)]
    slots = packing.place(0, gpus, [GiB] * 6, cores=32)  # 3 per GPU: the units need no more
    assert [s.gpu.name for s in slots] == ["0", "1", "0", "1", "0", "1"]
    envs = [packing.worker_env(s, environ={})[0] for s in slots]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "0", "1", "0", "1"]
    assert all(e["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" for e in envs)
    assert all(float(e["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == pytest.approx(0.9 / 3 - 1 / 80, abs=1e-3) for e in envs)
    # --parallel=K: K workers round-robin; one per GPU keeps XLA's defaults
    two = packing.place(2, gpus, [GiB] * 6)
    env = packing.worker_env(two[1], environ={"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"})[0]
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and "XLA_PYTHON_CLIENT_PREALLOCATE" not in env
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == ".5"  # the user's own setting is left alone
    three = packing.place(3, gpus, [GiB] * 6)
    assert [(s.gpu.name, s.sharing) for s in three] == [("0", 2), ("1", 1), ("0", 2)]
    assert packing.describe(slots) == ("3 workers on GPU 0 (each up to 0.287 of its memory); "
                                       "3 workers on GPU 1 (each up to 0.287 of its memory)")
    assert packing.devices(slots) == 2 and packing.devices(packing.place(3, [], [])) == 3


def test_a_share_smaller_than_a_run_is_refused_naming_the_setting():
    with pytest.raises(ConfigError, match=r"--parallel=8 puts 8 workers on GPU 0 \(80.0 GiB\).*needs an estimated "
                                          r"20.0 GiB.*--parallel=0 \(the sweep chooses: 2 per GPU"):
        packing.place(8, [H100], [20 * GiB])
    with pytest.raises(ConfigError, match="sweep.workers_per_device=6 .* sweep.workers_per_device=0"):
        packing.place(0, [H100], [20 * GiB], workers_per_device=6)
    assert len(packing.place(3, [H100], [20 * GiB])) == 3  # 23 GiB each: fits


def test_cpu_workers_split_the_cores_and_a_unit_alone_gets_them_all():
    cpus = sorted(os.sched_getaffinity(0))
    slots = packing.place(2, [], [])
    assert [s.gpu for s in slots] == [None, None]
    env, mine = packing.worker_env(slots[1], environ={})
    if len(cpus) >= 2:
        assert mine == cpus[len(cpus) // 2:2 * (len(cpus) // 2)] and env["OMP_NUM_THREADS"] == str(len(cpus) // 2)
    assert packing.worker_env(slots[1], alone=True, environ={}) == ({}, None)
    assert packing.place(0, [], [GiB] * 5) == [packing.Slot(0, None, 1)]  # no GPU: the runner's own process


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    listed = [("0", "GPU-aaaa-1111", 80 * GiB), ("1", "GPU-bbbb-2222", 40 * GiB)]
    monkeypatch.setattr(packing, "_nvidia_smi", lambda: listed)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert packing.visible_gpus() == [packing.Gpu("0", 80 * GiB), packing.Gpu("1", 40 * GiB)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb,0")  # a UUID prefix, in this order
    assert packing.visible_gpus() == [packing.Gpu("GPU-bbbb", 40 * GiB), packing.Gpu("0", 80 * GiB)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert packing.visible_gpus() == []
    monkeypatch.setattr(packing, "_nvidia_smi", lambda: [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # no nvidia-smi: the GPU is there, its memory unknown
    assert packing.visible_gpus() == [packing.Gpu("3", 0)]


def _config(**train) -> dict:
    c = plain_config(lm.get_config("llama_tiny"))
    c["model"]["vocab_size"] = 8192
    c["data"]["seq_len"] = 512
    c["train"].update(batch_size=32, compute_dtype="bfloat16", **train)
    return c


def test_a_unit_costs_what_training_memory_estimates_and_a_group_its_runs_together():
    from transformer.spec import model_spec
    from transformer.training import memory

    one = packing.unit_memory([_config()])
    cfg = model_spec(_config(), 8192).replace(attention_impl="cudnn")  # "auto" on a GPU in bf16
    assert one == pytest.approx(memory.estimate(cfg, batch_size=32, seq_len=512)["total"])
    assert packing.unit_memory([_config(), _config(learning_rate=1e-2)]) == pytest.approx(2 * one)
    assert packing.unit_memory([_config()], backend="cpu") > one  # chunked attention keeps its probabilities
    assert packing.unit_memory([_config(grad_accum_steps=4)]) < one  # one micro-batch's activations live


def test_out_of_memory_rows_are_recognised():
    assert packing.out_of_memory({"status": "failed", "error": "XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory "
                                                               "while trying to allocate 1.2GiB"})
    assert not packing.out_of_memory({"status": "failed", "error": "ValueError: bad"})
    assert not packing.out_of_memory({"status": "ok", "error": None}) and not packing.out_of_memory(None)


# ---- the scheduler: runner.run_parallel with stand-in workers on a faked GPU --------------------------------------

def _doc(tmp_path, multirun: bool) -> dict:
    runs = []
    for i, (d, lr) in enumerate([(64, 1e-3), (64, 2e-3), (64, 4e-3), (96, 1e-3), (128, 1e-3)]):
        c = _config(learning_rate=lr)
        c["model"]["d_model"] = d
        runs.append({"run_id": f"d{d}-lr{lr}", "index": i, "steps": 10, "batch_size": 32, "seq_len": 512,
                     "flops_per_token": 1e6, "flops": 1e6 * 10 * 32 * 512, "tokens": 10 * 32 * 512, "budget": 1e12,
                     "params": 1000, "params_non_embedding": 500, "size": 1000, "learning_rate": lr,
                     "warmup_steps": 1, "d_model": d, "num_layers": 2, "num_heads": 4, "head_dim": 16, "d_ff": 192,
                     "stage": "C1", "estimated_seconds": 10.0, "config": c})
    doc = {"name": "t", "mode": "isoflop", "notes": [], "runs": runs,
           "sweep": {"multirun": multirun, "claim_timeout_s": 600.0, "estimate_flops_per_second": 1e12,
                     "estimate_step_overhead_s": 0.01, "estimate_run_overhead_s": 5.0}}
    with open(tmp_path / "sweep.json", "w") as f:
        json.dump(doc, f)
    return doc


def _stand_in(workdir: str, doc: dict, oom_once: set[str], log: list):
    class Worker:
        """Records each run of its unit when polled; runs in `oom_once` fail out of memory the first time."""

        def __init__(self, cmd, env=None, **kwargs):
            self.runs = [doc["runs"][int(i)] for i in cmd[-1].split("=")[1].split(",")]
            self.pid, self.returncode, self.polls = 0, None, 0
            log.append(([r["run_id"] for r in self.runs], {k: env.get(k) for k in
                        ("CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE")}))

        def poll(self):
            self.polls += 1
            if self.polls < 3:
                return None
            for run in self.runs:
                oom = run["run_id"] in oom_once
                oom_once.discard(run["run_id"])
                row = runner.result_row(run, None if oom else {"status": "ok", "eval_loss": 2.0},
                                        "failed" if oom else "ok",
                                        "XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory" if oom else None,
                                        1.0, "isoflop")
                results.append_result(workdir, row)
            self.returncode = 0
            return 0

        def send_signal(self, s):
            pass

    return Worker


@pytest.mark.parametrize("multirun", [False, True])
def test_workers_share_a_gpu_and_a_run_out_of_memory_trains_again_alone(tmp_path, monkeypatch, multirun):
    workdir = str(tmp_path)
    doc = _doc(tmp_path, multirun)
    started: list = []
    monkeypatch.setattr(runner.subprocess, "Popen", _stand_in(workdir, doc, {"d96-lr0.001"}, started))
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    monkeypatch.setattr(packing, "visible_gpus", lambda: [H100])
    monkeypatch.setattr(packing.os, "sched_getaffinity", lambda pid: set(range(16)))  # the device machine's cores
    monkeypatch.setattr(runner.run_groups.execute, "finished_summary", lambda w, r: None)
    assert runner.run_parallel(workdir, doc, parallel=0) == 0
    rows = {r["run_id"]: r for r in results.read_results(workdir)}
    assert sorted(rows) == sorted(r["run_id"] for r in doc["runs"]) and all(r["status"] == "ok" for r in rows.values())
    units = [ids for ids, _ in started]
    # with sweep.multirun the three learning rates of d64 are one worker's unit (--run_index=0,1,2)
    assert (["d64-lr0.001", "d64-lr0.002", "d64-lr0.004"] in units) == multirun
    shared = [env for ids, env in started[:-1]]
    k = 3 if multirun else 5  # as many workers as units: they are small
    assert all(env["CUDA_VISIBLE_DEVICES"] == "0" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
               and float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) == pytest.approx(0.9 / k - 1 / 80, abs=1e-3)
               for env in shared)
    # the run that ran out of memory beside the others trained again, alone on the GPU: XLA's defaults
    assert started[-1] == (["d96-lr0.001"], {"CUDA_VISIBLE_DEVICES": "0", "XLA_PYTHON_CLIENT_PREALLOCATE": None,
                                             "XLA_PYTHON_CLIENT_MEM_FRACTION": None})


def test_a_group_worker_takes_indices_and_refuses_bad_ones(tmp_path):
    sweep_cli = cli_module("sweep")

    assert sweep_cli._indices(["3", "1"], 5) == [3, 1]
    for bad in (["5"], ["1", "1"], ["x"], ["-1"]):
        with pytest.raises(ConfigError, match="--run_index=.* must be run indices .* 0..4"):
            sweep_cli._indices(bad, 5)


# ---- the estimate ----------------------------------------------------------------------------------------------

def test_packed_seconds_is_bound_by_the_device_the_workers_and_the_longest_unit():
    units = [(100.0, 40.0)] * 6  # each 100 s alone, 40 s of it holding the device
    assert plan.packed_seconds(units, 1, 1) == 600  # one at a time: the sum
    assert plan.packed_seconds(units, 2, 1) == 300  # two workers: their time
    assert plan.packed_seconds(units, 6, 1) == 240  # six: the device's
    assert plan.packed_seconds(units, 6, 2) == 120 and plan.packed_seconds(units, 12, 12) == 100  # the longest
    assert plan.packed_seconds([], 4, 1) == 0


def test_a_group_shares_its_steps_overhead_and_its_start_up():
    s = {"estimate_flops_per_second": 1e12, "estimate_step_overhead_s": 0.01, "estimate_run_overhead_s": 5.0,
         "estimate_pack_overlap": 0.75}
    run = {"batch_size": 32, "seq_len": 512, "flops_per_token": 1e6, "steps": 100, "estimated_seconds": 7.0}
    c = 32 * 512 * 1e6 / 1e12
    assert plan.device_seconds(run, s) == pytest.approx(100 * (c + 0.25 * 0.01))
    alone, device = plan.unit_seconds([run] * 3, s)
    assert alone == pytest.approx(3 * 7.0 - 2 * (100 * 0.01 + 5.0)) and device == pytest.approx(100 * (3 * c + 0.0025))


def test_the_prior_eta_packs_each_stage_on_its_workers():
    s = {"estimate_flops_per_second": 1e12, "estimate_step_overhead_s": 0.01, "estimate_run_overhead_s": 5.0,
         "estimate_pack_overlap": 1.0}
    runs = [{"run_id": f"r{i}", "stage": "A" if i < 4 else "B", "batch_size": 1, "seq_len": 1, "flops_per_token": 0,
             "steps": 100, "flops": 1.0, "estimated_seconds": 6.0, "params": 1, "learning_rate": 1e-3}
            for i in range(6)]
    one = progress.Progress(runs, {}, settings=s)
    assert one.eta() == (pytest.approx(36.0), "prior: sweep.estimate_*")
    four = progress.Progress(runs, {}, settings=s, pack=lambda rs: ([[r] for r in rs], min(4, len(rs)), 1))
    assert four.eta_seconds() == pytest.approx(6.0 + 6.0)  # stage A's 4 runs at once, then B's 2


def test_max_hours_bounds_the_estimate_of_how_the_sweep_will_train_stage_by_stage():
    """Issue 30: sweep.max_hours bounded the one-process sum even where the runs share a GPU, so gpu_quick at the
    H100's measured rates would be refused although packed it fits. Now it bounds the estimate of the schedule the
    sweep will train on (design/estimate.Schedule, from runner.schedule): each stage's units packed on its workers,
    the stages summed (a stage trains once the one before is recorded), plus the set-up; the note and the refusal
    say which."""
    from configs.sweeps import quick
    from transformer.design import estimate
    from transformer.design.spec import SweepSpec

    c = quick.get_config()
    c.sweep.max_hours, c.sweep.min_sizes = 0.0, 4  # no limit yet; 4 sizes a budget, never fewer
    s = SweepSpec.of(c)
    runs = plan.design(s, preview=True).runs
    spec = plan.design(s, preview=True).spec
    four = plan.Schedule(lambda rs: ([[r] for r in rs], 4, 1), "on 4 workers sharing one device")
    listed = [estimate.listed(r, spec) for r in runs]
    by_stage = [[r for r in listed if r["stage"] == st] for st in dict.fromkeys(r["stage"] for r in listed)]
    assert len(by_stage) == 4  # 3 budgets and the validation run
    expected = sum(plan.packed_seconds([plan.unit_seconds([r], spec.settings()) for r in st], 4, 1) for st in by_stage)
    packed, one = plan.total_seconds(runs, spec, four), plan.total_seconds(runs, spec)
    assert packed == pytest.approx(expected + spec.estimate_setup_s) and packed < one
    c.sweep.max_hours = (packed + one) / 2 / 3600  # between the two
    notes = plan.design(c, preview=True, schedule=four).notes
    assert any(n.startswith(f"estimated time {packed / 60:.1f} min on 4 workers sharing one device, within")
               for n in notes)
    with pytest.raises(ConfigError, match=rf"is estimated at {one / 60:.1f} min in one process \(sweep.estimate_\*\), "
                                          rf"over its limit of {(packed + one) / 120:.1f} min"):
        plan.design(c, preview=True)


def test_the_dry_run_says_what_sharing_a_gpu_buys(tmp_path):
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "experiments.sweep", "--config=configs/sweeps/quick.py",
           f"--workdir={tmp_path}/s", "--dry_run", "--config.sweep.estimate_device_memory_gb=80",
           "--config.sweep.estimate_pack_overlap=0.9"]
    out = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert "with 4 workers on GPU (assumed)" in line and "sweep.estimate_device_memory_gb=80" in line, line
    packed, alone = (float(x) for x in __import__("re").findall(r"about ([\d.]+) min", line))
    assert packed < alone


# ---- the bench -------------------------------------------------------------------------------------------------

def test_the_bench_calibration_recovers_the_overheads_and_the_overlap(tmp_path):
    bench_pack = cli_module("bench_pack")

    F, s, o, omega = 1e12, 0.01, 5.0, 0.6
    rows = []
    for i, n in enumerate((100, 200, 400, 800)):
        c = 8 * 64 * 1e6 / F
        rows.append({"run_id": f"r{i}", "status": "ok", "steps": n, "batch_size": 8, "seq_len": 64,
                     "flops_per_token": 1e6, "wall_seconds": n * (c + s) + o})
    os.makedirs(tmp_path / "one")
    with open(tmp_path / "one" / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    device = sum(r["steps"] * (8 * 64 * 1e6 / F + (1 - omega) * s) for r in rows)
    got = bench_pack.calibrate(str(tmp_path), {"estimate_flops_per_second": F}, {"workers": {"wall_seconds": device}})
    assert got["estimate_step_overhead_s"] == pytest.approx(s) and got["estimate_run_overhead_s"] == pytest.approx(o)
    assert got["estimate_pack_overlap"] == pytest.approx(omega)


@pytest.mark.slow
def test_the_bench_on_the_cpu_packs_runs_whose_losses_equal_the_runs_alone(tmp_path, corpus_dir):
    """experiments/bench_pack.py at its CPU scale: 6 runs one at a time, then in 2 workers with sweep.multirun (2
    seed pairs as groups, 2 runs alone): every run recorded, each within the stated float32 tolerance of the run
    trained alone (workers 1e-5, groups 2e-2), the calibration printed."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu",
               TFDS_DATA_DIR=corpus_dir, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-m", "experiments.bench_pack", "--scale=cpu", "--modes=one,groups",
                          "--workers=2", f"--out={tmp_path}"], cwd=repo, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    b = json.loads(out.stdout)
    one, groups = b["modes"]["one"], b["modes"]["groups"]
    assert one["runs"] == one["ok"] == 6 and groups["runs"] == groups["ok"] == 6
    assert one["workers"] == "one process" and groups["workers"] == "2 workers"
    assert groups["speedup"] > 0 and groups["losses"]["tolerance"] == 2e-2
    assert groups["losses"]["within"], groups["losses"]
    grouped = [json.load(open(tmp_path / "groups" / "runs" / rid / "summary.json")).get("multirun")
               for rid in groups["losses"]["runs"]]
    assert sorted(grouped, key=str) == [2, 2, 2, 2, None, None]
    assert {"estimate_step_overhead_s", "estimate_run_overhead_s"} <= set(b["calibration"])  # overlap: from workers


def test_the_sweep_refuses_a_share_too_small_for_its_largest_run_before_training(monkeypatch):
    from configs.sweeps import gpu, quick

    monkeypatch.setattr(packing, "visible_gpus", lambda: [H100])
    with pytest.raises(ConfigError, match=r"--parallel=6 puts 6 workers on GPU 0.*largest run \(or group\)"):
        runner.check_slots(gpu.get_config(), 6)  # the validation run (~1e9 parameters at batch 32 x 1024)
    runner.check_slots(gpu.get_config(), 0)  # the sweep chooses: per stage, from the same estimates
    runner.check_slots(quick.get_config(), 6)  # tiny runs: six fit
    monkeypatch.setattr(packing, "visible_gpus", lambda: [])
    runner.check_slots(gpu.get_config(), 6)  # no GPU: workers split the CPU cores, nothing to check
