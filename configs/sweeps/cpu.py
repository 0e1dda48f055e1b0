"""The CPU IsoFLOP sweep: a scaling law measured on 2 CPU cores in under an hour (--parallel=2), then checked.

python -m experiments.sweep --config=configs/sweeps/cpu.py --workdir=DIR --parallel=2 [--dry_run]

Design (each choice measured or taken from the literature; docs/results/2026-11-24-cpu-sweep.md):
- Shapes: GPT-2 blocks at a fixed depth of 2 and head_dim 8, width d_model 16–160 in steps of 8, d_ff = 4·d:
  N changes smoothly (≤ 0.35 in ln N between neighbours above d32) and no IsoFLOP curve mixes depths (the
  previous ladder jumped 1 → 2 → 3 layers inside every curve, 0.26–0.29 nats a jump).
- Budgets 1.25e12–1e13 FLOPs, 5 sizes each spanning 4.5× in N around the optimum: the prior (80 tokens per
  parameter, where a pilot of this sweep found the first budget's optimum) for the first, then re-centred on the
  power law through the finished budgets' minima (sweep.recenter).
- Learning rate from measurement: lr = c·N^-0.5 (Adam's optimal rate ∝ 1/width at a fixed depth, N ∝ width²),
  c calibrated at the first budget (so at the sweep's tokens per parameter) on d32 and d56 at ½, 1 and 2× the
  rule (extended where the best is at an edge); the prior c = 1.2 is the pilot's calibration.
- Batch 8 × 128 tokens with AdamW β2 = 0.99: small models train best with small batches, where β2 = 0.99
  matters (Porian et al. 2024); every run takes ≥ 1,000 steps. Warm-up: N tokens (Porian et al.).
- Warm-up–stable–decay with a 20% "1−sqrt" cooldown (Hägele et al. 2024): each size's run at a budget continues
  from the decay start of its run at the budget before, so a size costs about its longest run plus the decays
  instead of the sum of its runs; the schedule check trains the 3 sizes nearest the 2.5e12 optimum under
  cosine too (DIR/fit/schedule_check.json).
- Noise: the 3 sizes nearest the first budget's optimum train under 2 more seeds; the fits take σ from them.
- The prediction check: after the grid, the fit predicts N_opt and the loss at 4e13 (4× the largest budget),
  writes DIR/fit/predictions.json, then trains that model and reports the error (DIR/fit/validation.json).
"""
from __future__ import annotations

import ml_collections

from configs.sweeps import common


def get_config() -> ml_collections.ConfigDict:
    base = common.tiny_lm_base(seq_len=128, batch_size=8)
    base.train.schedule = "wsd"
    base.train.decay_fraction = 0.2
    base.train.final_lr_fraction = 0.0
    base.train.b2 = 0.99
    base.train.eval_steps = 64  # 64 × 8 × 128 = 65k eval tokens, the same rows at every evaluation
    return common.make(dict(
        name="cpu",
        budgets=(1.25e12, 2.5e12, 5e12, 1e13),
        d_models=tuple(range(16, 161, 8)),
        num_layers=2, head_dim=8, ffn_ratio=4.0,
        sizes_per_budget=5, size_span=4.5, prior_tokens_per_param=80.0, recenter=True,
        lr_coefficient=1.2, lr_exponent=-0.5, lr_max=3e-2,
        lr_calibration=dict(d_models=(32, 56), multipliers=(0.5, 1.0, 2.0)),
        warmup_tokens_per_param=1.0, warmup_min=20, min_steps=1000, branch=True,
        seeds=dict(extra=2, sizes=3),
        schedule_check=dict(budget=2.5e12, schedule="cosine", sizes=3),
        validate_flops=4e13,
        evals_per_run=2, checkpoints_per_run=4, logs_per_run=10,
        estimate_flops_per_second=2.7e10, estimate_step_overhead_s=0.003, estimate_run_overhead_s=8.0,
    ), base)
