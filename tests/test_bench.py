"""experiments/bench.py: the --json contract, on a tiny model for 2 steps."""
from __future__ import annotations

import glob
import gzip
import json
import math
import os
import subprocess
import sys

import pytest

from transformer.training import hardware
from cli_modules import cli_module
from xla_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTRACT_KEYS = ("tokens_per_second", "step_seconds", "compile_seconds", "flops_per_token", "mfu", "peak_flops",
                 "peak_flops_source", "peak_memory_bytes", "device")


# gpt2_tiny (d 64, 2 layers, d_ff 256, tied head) at T=32, vocab 259 padded to 384, counted by hand:
# 6·N_matmul + 12·L·T·D, N_matmul = per layer QKV+output (4·D²) and the MLP (2·D·F), plus the head (V·D)
V, D, L, F, T, B = 384, 64, 2, 256, 32, 8
FLOPS_PER_TOKEN = 6 * (L * (4 * D * D + 2 * D * F) + V * D) + 12 * L * T * D
# causal self-attention at half (MaxText's count): the bench's mfu_causal_half, beside mfu
FLOPS_PER_TOKEN_CAUSAL_HALF = 6 * (L * (4 * D * D + 2 * D * F) + V * D) + 6 * L * T * D
# every parameter: embeddings (V·D + 1024·D positions), per layer 2 LayerNorms, QKV/out/MLP weights and biases
PARAMS = V * D + 1024 * D + L * (2 * 2 * D + 4 * D * D + 4 * D + 2 * D * F + F + D) + 2 * D


def _bench(*extra: str, devices: int = 1) -> dict:
    """experiments.bench in a fresh process on `devices` CPU devices (not the 8 this test session simulates,
    unless asked for)."""
    cmd = [sys.executable, "-m", "experiments.bench", "--config=configs/lm.py:gpt2_tiny",
           f"--config.data.seq_len={T}", f"--config.train.batch_size={B}", "--steps=2", "--json", *extra]
    env = {**os.environ, "TRANSFORMER_HUGE_PAGES": "0",
           "XLA_FLAGS": xla_flags(devices)}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, out.stdout  # exactly one JSON object on stdout
    return json.loads(lines[0])


PROFILE_STEPS = 3


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> dict:
    """One `experiments.bench --json --compare_torch --profile_dir` run for the tests below: the torch comparison
    and the profile only add keys to the contract's, whose values come from our steps timed alone, before any
    torch step or traced step."""
    trace_dir = str(tmp_path_factory.mktemp("bench") / "trace")
    return _bench("--compare_torch", "--rounds=1", f"--profile_dir={trace_dir}", f"--profile_steps={PROFILE_STEPS}")


def test_json_contract(bench_run):
    r = bench_run
    for key in CONTRACT_KEYS:
        assert key in r, key
    assert r["num_devices"] == 1
    assert r["timed_steps"] == 2 and 0 < r["step_seconds_min"] <= r["step_seconds"] and r["compile_seconds"] > 0
    assert r["tokens_per_second"] > 0  # its value from the tokens fed and the time taken: test_throughput_...
    assert r["flops_per_token"] == pytest.approx(FLOPS_PER_TOKEN)
    assert r["params"] == PARAMS
    # MFU over one CPU's measured matmul peak (how it is computed: test_throughput_and_mfu_...)
    assert r["peak_flops_source"].startswith("measured") and r["peak_flops"] > 1e8
    assert 0 < r["mfu"] < 1
    assert r["initial_loss"] == pytest.approx(math.log(V), abs=0.1)  # small init: near-uniform predictions
    assert r["peak_memory_bytes"] > 4 * 3 * PARAMS  # at least params + AdamW moments (float32)
    assert r["flops_per_token_causal_half"] == pytest.approx(FLOPS_PER_TOKEN_CAUSAL_HALF)
    assert r["mfu_causal_half"] == pytest.approx(r["mfu"] * FLOPS_PER_TOKEN_CAUSAL_HALF / FLOPS_PER_TOKEN)


def test_memory_estimate_beside_the_peak(bench_run):
    """The estimator's total for this config (training/memory.py, checked against XLA in test_memory.py) beside
    the measured peak (here XLA's memory analysis: a CPU has no allocator peak), and their ratio."""
    from configs import lm
    from transformer.training import memory

    r = bench_run
    c = lm.get_config("gpt2_tiny")
    c.data.seq_len, c.train.batch_size = T, B
    assert r["memory_estimate_bytes"] == memory.estimate_from_config(c, V, 1)["total"]
    assert r["memory_peak_bytes"] == r["peak_memory_bytes"] and r["peak_memory_source"].startswith("XLA")
    assert r["memory_estimate_error"] == pytest.approx(r["memory_estimate_bytes"] / r["memory_peak_bytes"] - 1)


def test_profile_of_the_bench_steps(bench_run):
    """--profile_dir: a trace of --profile_steps more steps (after the timed ones), the step's HLO beside it, and
    where the steps' time went (experiments/profile_share.py; its classification: test_profile_share.py)."""
    r = bench_run
    p = r["profile"]
    assert p["module"] == "jit_train_step" and p["classified_by"] == "hlo"
    assert os.path.isfile(p["trace"]) and p["trace"].startswith(r["profile_dir"])
    assert os.path.isfile(os.path.join(r["profile_dir"], "jit_train_step.hlo.txt"))
    assert sum(p["share"].values()) == pytest.approx(1.0)
    assert 0 < p["share"]["matmul"] < 1 and p["share"]["attention"] == 0.0  # chunked attention: no cuDNN
    trace = glob.glob(os.path.join(os.path.dirname(p["trace"]), "*.trace.json.gz"))[0]
    steps = sorted(int(e["args"]["step_num"]) for e in json.load(gzip.open(trace))["traceEvents"]
                   if e.get("name") == "bench")
    assert steps == list(range(PROFILE_STEPS))  # the traced steps, each marked, nothing else


@pytest.mark.parametrize("flag, match", [("--profile_steps=0", "--profile_steps=0 must be at least 1"),
                                         ("--profile_dir={file}", "is a file; name a directory")])
def test_bad_profile_flags_fail_before_any_step(tmp_path, flag, match):
    file = tmp_path / "trace"
    file.write_text("")
    cmd = [sys.executable, "-m", "experiments.bench", "--config=configs/lm.py:gpt2_tiny", "--steps=2", "--json",
           f"--profile_dir={tmp_path / 'new'}", flag.format(file=file)]
    out = subprocess.run(cmd, cwd=REPO, env={**os.environ, "TRANSFORMER_HUGE_PAGES": "0"}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith("error: ")
    assert match in out.stderr and out.stdout == "" and not (tmp_path / "new").exists()  # nothing written


@pytest.mark.slow  # CI's 15 minutes: 22 s of the default run on 2 loaded cores (2026-11-27)
def test_throughput_and_mfu_from_the_tokens_fed_and_the_time_taken(monkeypatch):
    """In this process (8 simulated CPU devices): the steps' times replaced by known ones and the peak by a
    known one, the tokens counted in the batches the timed steps were actually fed. Tokens/s is those tokens
    over the median step time; MFU is the hand-counted FLOPs at that rate over the peak, counted once: the
    simulated devices share the process's cores, which the measured CPU peak already uses (not 8× low)."""
    import jax
    import numpy as np
    from configs import lm
    bench = cli_module("bench")

    fed, real_time_steps = [], bench.time_steps

    def timed(compiled, state, batch, n):  # the real steps, reported as taking 0.4, 0.1, 0.15 s
        fed.append([float(np.sum(np.asarray(batch["weights"])))] * n)
        state, _ = real_time_steps(compiled, state, batch, n)
        return state, [0.4, 0.1, 0.15][:n]

    monkeypatch.setattr(bench, "time_steps", timed)
    monkeypatch.setattr(hardware, "device_peak_flops", lambda device: {"flops": 1e12, "source": "test"})
    c = lm.get_config("gpt2_tiny")
    c.data.seq_len, c.train.batch_size = T, B
    r = bench.bench(c, steps=3)
    assert jax.device_count() == r["num_devices"] == 8
    tokens_per_step = fed[-1]  # the timed steps' (the last call; the first is the warm-up)
    assert r["timed_steps"] == len(tokens_per_step) == 3 and len(set(tokens_per_step)) == 1
    assert r["step_seconds"] == 0.15 and r["step_seconds_min"] == 0.1  # the median (not the mean) and the fastest
    assert r["tokens_per_second"] == pytest.approx(tokens_per_step[0] / 0.15)
    assert r["mfu"] == pytest.approx(tokens_per_step[0] / 0.15 * FLOPS_PER_TOKEN / 1e12, rel=1e-6)
    assert r["mfu_causal_half"] == pytest.approx(tokens_per_step[0] / 0.15 * FLOPS_PER_TOKEN_CAUSAL_HALF / 1e12,
                                                 rel=1e-6)


def test_compare_torch_times_the_same_model(bench_run):
    r = bench_run
    assert r["torch_threads"] == hardware.xla_cpu_threads()
    # the same model: every parameter, and the same initial loss, ln V for both (random tokens)
    assert r["torch_params"] == r["params"] == PARAMS
    assert r["torch_initial_loss"] == pytest.approx(math.log(V), abs=0.1)
    assert r["initial_loss"] == pytest.approx(math.log(V), abs=0.1)
    assert r["torch_optimizer"] == "AdamW(fused=True)"
    assert r["torch_alone_tokens_per_second"] > 0 and r["interleaved_tokens_per_second"] > 0
    assert r["ours_over_torch"] == pytest.approx(r["interleaved_tokens_per_second"] / r["torch_tokens_per_second"])


def test_peak_table():
    """The table (read once, from the library) by its properties, not its numbers typed out again."""
    table = dict(hardware.PEAK_FLOPS)
    peak = lambda kind: hardware.peak_flops(kind)["flops"]
    assert len(table) == len(hardware.PEAK_FLOPS)  # no key listed twice
    for key in table:  # first match wins: no entry is shadowed by a shorter key listed before it
        assert hardware.peak_flops(key)["source"] == f"table: {key}", key
    for kind, key in (("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100 pcie"),
                      ("NVIDIA H100 NVL", "h100 nvl"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
                      ("TPU v4", "tpu v4"), ("TPU v5 lite", "tpu v5 lite"), ("TPU v5", "tpu v5"),
                      ("TPU v6 lite", "tpu v6 lite")):  # device_kind as JAX reports it → the intended entry
        assert hardware.peak_flops(kind)["source"] == f"table: {key}", kind
    # dense (no 2:4 sparsity) bf16 peaks: each of these devices is between 100 TFLOP/s and 1.5 PFLOP/s dense
    # (the H100 SXM's sparse figure, 1979, would be out)
    assert all(1e14 < flops < 1.5e15 for flops in table.values()), table
    # published relations: the H200 is the H100 SXM's die; SXM > NVL > PCIe (power and clocks) > A100;
    # v5e is the TPU v5 lite; v6e > v5p > v4 > v5e
    assert peak("NVIDIA H200") == peak("NVIDIA H100 80GB HBM3")
    assert peak("NVIDIA H100 80GB HBM3") > peak("NVIDIA H100 NVL") > peak("NVIDIA H100 PCIe") > peak("A100")
    assert peak("TPU v5e") == peak("TPU v5 lite")
    assert peak("TPU v6 lite") > peak("TPU v5") > peak("TPU v4") > peak("TPU v5 lite")
    assert hardware.peak_flops("cpu")["flops"] is None


@pytest.mark.slow  # a bench run with a profile (~20 s on 2 idle cores): the default run stays under CI's 15 minutes
def test_a_trace_without_kernels_keeps_the_timings(monkeypatch, tmp_path):
    """A trace in which no kernel was recorded (a GPU whose CUPTI is missing) says so in `profile`; the timings
    and the rest of the JSON stand."""
    from configs import lm
    bench, profile_share = cli_module("bench"), cli_module("profile_share")

    monkeypatch.setattr(profile_share, "read_ops", lambda path: [])
    c = lm.get_config("gpt2_tiny")
    c.data.seq_len, c.train.batch_size = T, B
    r = bench.bench(c, steps=1, profile_dir=str(tmp_path / "trace"), profile_count=1)
    assert "holds no executed XLA instruction" in r["profile"]["error"]
    assert r["tokens_per_second"] > 0 and r["memory_estimate_bytes"] > 0
