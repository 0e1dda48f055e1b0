"""Peak dense matmul throughput per device kind (for model FLOPs utilization, MFU) and peak memory.

Table figures are the vendors' dense (no sparsity) peaks for the compute dtype most training uses
(bfloat16): H100 SXM 989.4 TFLOP/s, H100 PCIe 756, H100 NVL 835, H200 989.4 (same die as the H100
SXM), A100 312, TPU v4 275, v5e 197, v5p 459, v6e 918. CPUs have no entry: `measure_matmul_flops`
times a large float32 matmul instead (what this CPU reaches through XLA, not a datasheet figure).
"""
from __future__ import annotations

import os
import time
from typing import Any


# device_kind substring (lower case) → peak bf16 FLOP/s per device. Order matters: the first match wins.
PEAK_FLOPS = (
    ("h200", 989e12),
    ("h100 pcie", 756e12),
    ("h100 nvl", 835e12),
    ("h100", 989e12),          # SXM ("NVIDIA H100 80GB HBM3")
    ("a100", 312e12),
    ("tpu v5 lite", 197e12),   # v5e reports itself as "TPU v5 lite"
    ("tpu v5e", 197e12),
    ("tpu v5p", 459e12),
    ("tpu v5", 459e12),        # v5p reports itself as "TPU v5"
    ("tpu v6 lite", 918e12),   # v6e (Trillium)
    ("tpu v4", 275e12),
)


def peak_flops(device: Any) -> dict:
    """{"flops": peak FLOP/s or None, "source": where it came from}."""
    kind = str(getattr(device, "device_kind", device)).lower()
    for key, flops in PEAK_FLOPS:
        if key in kind:
            return {"flops": flops, "source": f"table: {key}"}
    return {"flops": None, "source": f"unknown device kind {kind!r}"}


def measure_matmul_flops(n: int = 2048, repeats: int = 7, dtype: str = "float32") -> float:
    """Best-of-`repeats` FLOP/s of one jitted n×n @ n×n matmul on the default device (2n³ FLOPs)."""
    import jax

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    matmul = jax.jit(lambda x, y: x @ y)
    matmul(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def device_peak_flops(device: Any) -> dict:
    """The table's peak where the device kind is known; on CPU the measured float32 matmul rate."""
    peak = peak_flops(device)
    if peak["flops"] is None and getattr(device, "platform", "") == "cpu":
        flops = measure_matmul_flops()
        return {"flops": flops, "source": "measured: best of 7 jitted 2048x2048 float32 matmuls on this CPU"}
    return peak


def peak_memory(device: Any, compiled: Any | None = None) -> dict:
    """{"bytes", "source"}: the device allocator's peak where it keeps one (GPU, TPU); on CPU the compiled
    step's buffer sizes from XLA's memory_analysis (arguments + outputs − aliased + temporaries)."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        return {"bytes": int(stats["peak_bytes_in_use"]), "source": "device memory_stats peak_bytes_in_use"}
    if compiled is not None:
        m = compiled.memory_analysis()
        if m is not None:
            total = (m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
                     + m.temp_size_in_bytes)
            return {"bytes": int(total), "source": "XLA memory_analysis of the compiled step "
                                                   "(arguments + outputs - aliased + temporaries)"}
    return {"bytes": None, "source": "unavailable"}


def process_rss_bytes() -> int | None:
    """Peak resident set size of this process (Linux ru_maxrss is in KiB)."""
    try:
        import resource
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (ImportError, OSError):
        return None


def xla_cpu_threads() -> int:
    """Threads XLA's CPU backend uses: the cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def describe_device(device: Any) -> str:
    kind = getattr(device, "device_kind", str(device))
    return f"{getattr(device, 'platform', '?')}: {kind}" + (f" ({xla_cpu_threads()} threads)"
                                                             if getattr(device, "platform", "") == "cpu" else "")

