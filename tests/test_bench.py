"""experiments/bench.py: the --json contract, on a tiny model for 2 steps."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from transformer.training import hardware

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTRACT_KEYS = ("tokens_per_second", "step_seconds", "compile_seconds", "flops_per_token", "mfu", "peak_flops",
                 "peak_flops_source", "peak_memory_bytes", "device")


# gpt2_tiny (d 64, 2 layers, d_ff 256, tied head) at T=32, vocab 259 padded to 384, counted by hand:
# 6·N_matmul + 12·L·T·D, N_matmul = per layer QKV+output (4·D²) and the MLP (2·D·F), plus the head (V·D)
V, D, L, F, T, B = 384, 64, 2, 256, 32, 8
FLOPS_PER_TOKEN = 6 * (L * (4 * D * D + 2 * D * F) + V * D) + 12 * L * T * D
# every parameter: embeddings (V·D + 1024·D positions), per layer 2 LayerNorms, QKV/out/MLP weights and biases
PARAMS = V * D + 1024 * D + L * (2 * 2 * D + 4 * D * D + 4 * D + 2 * D * F + F + D) + 2 * D


def _bench(*extra: str, devices: int = 1) -> dict:
    """experiments.bench in a fresh process on `devices` CPU devices (not the 8 this test session simulates,
    unless asked for)."""
    cmd = [sys.executable, "-m", "experiments.bench", "--config=configs/lm.py:gpt2_tiny",
           f"--config.data.seq_len={T}", f"--config.train.batch_size={B}", "--steps=2", "--json", *extra]
    env = {**os.environ, "TRANSFORMER_HUGE_PAGES": "0",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, out.stdout  # exactly one JSON object on stdout
    return json.loads(lines[0])


def test_json_contract():
    r = _bench()
    for key in CONTRACT_KEYS:
        assert key in r, key
    assert r["num_devices"] == 1
    assert r["timed_steps"] == 2 and 0 < r["step_seconds_min"] <= r["step_seconds"] and r["compile_seconds"] > 0
    assert r["tokens_per_second"] == pytest.approx(B * T / r["step_seconds"])
    assert r["flops_per_token"] == pytest.approx(FLOPS_PER_TOKEN)
    assert r["params"] == PARAMS
    # MFU: the FLOPs counted above, done in the measured step time, over one CPU's measured matmul peak
    assert r["peak_flops_source"].startswith("measured") and r["peak_flops"] > 1e8
    achieved = B * T * FLOPS_PER_TOKEN / r["step_seconds"]
    assert r["mfu"] == pytest.approx(achieved / r["peak_flops"], rel=1e-6)
    assert 0 < r["mfu"] < 1
    assert r["initial_loss"] == pytest.approx(math.log(V), abs=0.1)  # small init: near-uniform predictions
    assert r["peak_memory_bytes"] > 4 * 3 * PARAMS  # at least params + AdamW moments (float32)


def test_mfu_counts_the_cpu_once_however_many_simulated_devices_share_it():
    """8 simulated devices share the process's cores, which the measured peak already uses: MFU is not 8× low."""
    r = _bench(devices=8)
    assert r["num_devices"] == 8
    assert r["mfu"] == pytest.approx(B * T * FLOPS_PER_TOKEN / r["step_seconds"] / r["peak_flops"], rel=1e-6)


def test_compare_torch_times_the_same_model():
    r = _bench("--compare_torch", "--rounds=1")
    assert r["torch_threads"] == hardware.xla_cpu_threads()
    # the same model: every parameter, and the same initial loss, ln V for both (random tokens)
    assert r["torch_params"] == r["params"] == PARAMS
    assert r["torch_initial_loss"] == pytest.approx(math.log(V), abs=0.1)
    assert r["initial_loss"] == pytest.approx(math.log(V), abs=0.1)
    assert r["torch_optimizer"] == "AdamW(fused=True)"
    assert r["torch_alone_tokens_per_second"] > 0 and r["interleaved_tokens_per_second"] > 0
    assert r["ours_over_torch"] == pytest.approx(r["interleaved_tokens_per_second"] / r["torch_tokens_per_second"])


def test_peak_table():
    assert hardware.peak_flops("NVIDIA H100 80GB HBM3")["flops"] == 989e12
    assert hardware.peak_flops("NVIDIA H100 PCIe")["flops"] == 756e12
    assert hardware.peak_flops("NVIDIA H200")["flops"] == 989e12
    assert hardware.peak_flops("NVIDIA A100-SXM4-80GB")["flops"] == 312e12
    assert hardware.peak_flops("TPU v5 lite")["flops"] == 197e12
    assert hardware.peak_flops("TPU v5")["flops"] == 459e12
    assert hardware.peak_flops("TPU v4")["flops"] == 275e12
    assert hardware.peak_flops("cpu")["flops"] is None
