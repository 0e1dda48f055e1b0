"""The CPU IsoFLOP sweep: 4 budgets × 6 models (N ≈ 1e4–4e5), 39 min on 2 CPU cores with --parallel=2.

python -m experiments.sweep --config=configs/sweeps/cpu.py --workdir=DIR [--dry_run]
Byte tokenizer, seq_len 128, batch 32 (4,096 tokens per step), GPT-2-shaped models, head_dim 16.
The prior centres each budget on 300 tokens per parameter, where the quick sweep's IsoFLOP minima sat
(1e11–6e11 FLOPs), far above Chinchilla's 20 at these tiny, byte-level sizes. A first run centred on 50
tokens per parameter (N 2.5e4–8.4e5) had its smallest model win every one of its first three budgets,
so every budget was dropped as an edge minimum: the ladder now starts at d_model 16.
"""
from __future__ import annotations

import ml_collections

from configs.sweeps import common


def get_config() -> ml_collections.ConfigDict:
    return common.make(dict(
        name="cpu",
        budgets=(1e12, 2.5e12, 6e12, 1.5e13),
        d_models=(16, 32, 48, 64, 80, 96, 128, 160, 192, 256),
        head_dim=16, aspect_ratio=32.0,
        sizes_per_budget=6, size_span=16.0, prior_tokens_per_param=300.0,
        lr_coefficient=0.05, lr_exponent=-0.25, lr_max=1e-2,
        warmup_fraction=0.05, warmup_min=10,
        evals_per_run=4, checkpoints_per_run=4, logs_per_run=10,
        estimate_flops_per_second=5e10, estimate_step_overhead_s=0.01, estimate_run_overhead_s=10.0,
    ), common.tiny_lm_base(seq_len=128, batch_size=32))
