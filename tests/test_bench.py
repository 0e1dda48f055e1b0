"""experiments/bench.py: the --json contract, on a tiny model for 2 steps."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from transformer.training import hardware

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTRACT_KEYS = ("tokens_per_second", "step_seconds", "compile_seconds", "flops_per_token", "mfu", "peak_flops",
                 "peak_flops_source", "peak_memory_bytes", "device")


def _bench(*extra: str) -> dict:
    cmd = [sys.executable, "-m", "experiments.bench", "--config=configs/lm.py:gpt2_tiny",
           "--config.data.seq_len=32", "--config.train.batch_size=8", "--steps=2", "--json", *extra]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, out.stdout  # exactly one JSON object on stdout
    return json.loads(lines[0])


def test_json_contract():
    r = _bench()
    for key in CONTRACT_KEYS:
        assert key in r, key
    assert r["timed_steps"] == 2 and r["step_seconds"] > 0 and r["compile_seconds"] > 0
    assert r["tokens_per_second"] == pytest.approx(8 * 32 / r["step_seconds"])
    # gpt2_tiny at T=32, vocab 259 padded to 384: 6·N_matmul + 12·L·T·D
    n_matmul = 2 * (4 * 64 * 64 + 2 * 64 * 256) + 384 * 64
    assert r["flops_per_token"] == pytest.approx(6 * n_matmul + 12 * 2 * 32 * 64)
    assert r["peak_flops_source"].startswith("measured") and r["peak_flops"] > 1e8
    assert r["mfu"] == pytest.approx(r["tokens_per_second"] * r["flops_per_token"]
                                     / (r["peak_flops"] * r["num_devices"]))
    assert r["peak_memory_bytes"] > 4 * 3 * 100_000  # at least params + AdamW moments (float32)


def test_compare_torch_reports_ratio():
    r = _bench("--compare_torch", "--rounds=1")
    assert r["torch_threads"] == hardware.xla_cpu_threads()
    assert r["ours_over_torch"] == pytest.approx(r["tokens_per_second"] / r["torch_tokens_per_second"])


def test_peak_table():
    assert hardware.peak_flops("NVIDIA H100 80GB HBM3")["flops"] == 989e12
    assert hardware.peak_flops("NVIDIA H100 PCIe")["flops"] == 756e12
    assert hardware.peak_flops("NVIDIA H200")["flops"] == 989e12
    assert hardware.peak_flops("NVIDIA A100-SXM4-80GB")["flops"] == 312e12
    assert hardware.peak_flops("TPU v5 lite")["flops"] == 197e12
    assert hardware.peak_flops("TPU v5")["flops"] == 459e12
    assert hardware.peak_flops("TPU v4")["flops"] == 275e12
    assert hardware.peak_flops("cpu")["flops"] is None
