"""Peak dense matmul throughput per device kind, for model FLOPs utilization (MFU).

Figures are the vendors' dense (no sparsity) peaks for the compute dtype most training uses
(bfloat16). CPUs have no table entry: `experiments/bench.py` measures their float32 matmul rate.
"""
from __future__ import annotations

from typing import Any

# device_kind substring (lower case) → peak bf16 FLOP/s per device.
PEAK_FLOPS = (
    ("h200", 989e12),
    ("h100 pcie", 756e12),
    ("h100", 989e12),          # SXM
    ("a100", 312e12),
    ("tpu v5p", 459e12),
    ("tpu v5 lite", 197e12),   # v5e reports itself as "TPU v5 lite"
    ("tpu v5e", 197e12),
    ("tpu v4", 275e12),
)


def peak_flops(device: Any) -> dict:
    """{"flops": peak FLOP/s or None, "source": where it came from}."""
    kind = str(getattr(device, "device_kind", device)).lower()
    for key, flops in PEAK_FLOPS:
        if key in kind:
            return {"flops": flops, "source": f"table: {key}"}
    return {"flops": None, "source": f"unknown device kind {kind!r}"}
