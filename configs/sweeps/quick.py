"""The quick IsoFLOP sweep: the README's main job, a few minutes on 2 CPU cores (compilation included).

python -m experiments.sweep --config=configs/sweeps/quick.py --workdir=runs/quick
The cpu sweep's design (configs/sweeps/cpu.py) at a tenth of its compute: 2-layer GPT-2 blocks of width 8–96
(head_dim 8), byte tokenizer, seq_len 64, batch 16, AdamW β2 = 0.99, warm-up–stable–decay runs that branch
from the previous budget's decay start, budgets re-centred on the minima found so far, and the prediction
check: the fit predicts the compute-optimal model and its loss at 4× the largest budget before training it.
The budgets are left to the sweep (sweep.budgets empty): the smallest that give each budget a full IsoFLOP curve
around the prior with at least 200 steps a run, for the tokenizer the data uses (with bytes: 1e11, 2e11, 4e11),
within sweep.max_hours.
The learning rate is the cpu sweep's calibrated rule (1.2·N^-0.5), and the prior 80 tokens per parameter is
where the cpu sweep found its first budget's optimum. Enough to see IsoFLOP valleys, a fit and a checked
prediction; not to measure exponents well (cpu.py, gpu.py).
"""
from __future__ import annotations

import ml_collections

from configs.sweeps import common


def get_config() -> ml_collections.ConfigDict:
    base = common.tiny_lm_base(seq_len=64, batch_size=16)
    base.train.schedule = "wsd"
    base.train.decay_fraction = 0.2
    base.train.final_lr_fraction = 0.0
    base.train.b2 = 0.99
    return common.make(dict(
        name="quick",
        budgets=(),  # chosen by the sweep for the tokenizer (design/budgets.py): 1e11, 2e11, 4e11 with bytes
        max_hours=0.5,
        d_models=tuple(range(8, 97, 8)),
        num_layers=2, head_dim=8,
        sizes_per_budget=4, size_span=6.0, prior_tokens_per_param=80.0, recenter=True,
        lr_coefficient=1.2, lr_exponent=-0.5, lr_max=3e-2,
        warmup_tokens_per_param=1.0, warmup_min=10, min_steps=200, branch=True,
        validate_ratio=4.0,  # the prediction checked at 4× the largest budget (1.6e12 with bytes)
        evals_per_run=2, checkpoints_per_run=2, logs_per_run=4,
        estimate_flops_per_second=2.8e10, estimate_step_overhead_s=0.004, estimate_run_overhead_s=6.0,
    ), base)
