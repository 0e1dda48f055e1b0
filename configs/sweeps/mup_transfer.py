"""μP's learning-rate transfer, measured: an LR scan at 3 widths spanning 4x (d_model 32, 64, 128) at fixed depth.

Run it twice, under the standard parametrization and under μP (base width 32, so the d32 runs are the same
model in both), then draw both scans side by side:
  python -m experiments.sweep --config=configs/sweeps/mup_transfer.py --workdir=runs/mup_transfer_sp
  python -m experiments.sweep --config=configs/sweeps/mup_transfer.py --workdir=runs/mup_transfer_mup \\
      --config.base.model.parametrization=mup
  python -m experiments.plot_lr_scans --scans=runs/mup_transfer_sp,runs/mup_transfer_mup --titles=SP,μP \\
      --out=docs/figures/mup/lr_transfer.png
Each sweep ends with DIR/lr_fit.json (each width's optimal peak LR and lr_opt = c·N^k: k is how the optimum
moves with size, near 0 when it transfers) and DIR/lr_scan.png. Every width trains on the same tokens
(sweep.lr_scan.tokens), so only the width changes along a scan's sizes. About 15 min per parametrization on 2 CPU cores.
"""
from __future__ import annotations

import ml_collections

from configs.sweeps import common

BASE_WIDTH = 32


def get_config() -> ml_collections.ConfigDict:
    base = common.tiny_lm_base(seq_len=64, batch_size=16)
    base.model.mup_base_width = BASE_WIDTH  # used when --config.base.model.parametrization=mup
    return common.make(dict(
        name="mup_transfer", mode="lr_scan",
        head_dim=16, min_layers=2, max_layers=2,   # fixed depth: width grows by heads of 16
        warmup_fraction=0.05, warmup_min=10,
        evals_per_run=1, checkpoints_per_run=1, logs_per_run=5,
        estimate_flops_per_second=5e10, estimate_step_overhead_s=0.004, estimate_run_overhead_s=8.0,
        lr_scan=dict(d_models=(32, 64, 128), lr_min=5e-4, lr_max=3.2e-2, num_lrs=7, tokens=1200 * 16 * 64),
    ), base)
