"""The quick IsoFLOP sweep: 3 budgets × 4 tiny models, about 2–3 minutes on 2 CPU cores (compilation included).

python -m experiments.sweep --config=configs/sweeps/quick.py --workdir=/tmp/quick
Byte tokenizer, seq_len 64, batch 16, GPT-2-shaped models of ~3e3–1e5 parameters; enough to see
IsoFLOP valleys and fit rough exponents, not to measure them well (configs/sweeps/cpu.py, gpu.py).
At these budgets (1e11–6e11 FLOPs) the loss-optimal models see far more than 20 tokens per parameter
(with the default prior of 20 the smallest model won every budget), so the prior here is 100.
"""
from __future__ import annotations

import ml_collections

from configs.sweeps import common


def get_config() -> ml_collections.ConfigDict:
    return common.make(dict(
        name="quick",
        budgets=(1e11, 2.5e11, 6e11),
        d_models=(8, 16, 24, 32, 40, 48, 64, 80, 96),
        head_dim=8, aspect_ratio=32.0,
        sizes_per_budget=4, size_span=16.0, prior_tokens_per_param=100.0,
        lr_coefficient=0.1, lr_exponent=-0.25, lr_max=2e-2,
        warmup_fraction=0.05, warmup_min=5,
        evals_per_run=4, checkpoints_per_run=2, logs_per_run=4,
        estimate_flops_per_second=2.8e10, estimate_step_overhead_s=0.004, estimate_run_overhead_s=8.0,
    ), common.tiny_lm_base(seq_len=64, batch_size=16))
