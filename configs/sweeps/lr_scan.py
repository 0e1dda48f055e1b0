"""Learning-rate scan at small scale: 3 sizes × 5 peak learning rates, about 20 minutes on 2 CPU cores.

python -m experiments.sweep --config=configs/sweeps/lr_scan.py --workdir=DIR
Each size trains on tokens_per_param · N tokens at every learning rate of a log grid; the sweep ends
by writing DIR/lr_fit.json (each size's optimum and lr_opt = c·N^k) and DIR/lr_scan.png. An IsoFLOP
sweep with the same base and ladder settings then uses it:
  python -m experiments.sweep --config=configs/sweeps/cpu.py --config.sweep.lr_fit=DIR/lr_fit.json ...
"""
from __future__ import annotations

import ml_collections

from configs.sweeps import common


def get_config() -> ml_collections.ConfigDict:
    return common.make(dict(
        name="lr_scan", mode="lr_scan",
        head_dim=16, aspect_ratio=32.0,
        warmup_fraction=0.05, warmup_min=10,
        evals_per_run=1, checkpoints_per_run=2, logs_per_run=5,
        estimate_flops_per_second=2.5e10, estimate_step_overhead_s=0.01, estimate_run_overhead_s=8.0,
        lr_scan=dict(d_models=(32, 48, 64), lr_min=1e-3, lr_max=3e-2, num_lrs=5, tokens_per_param=20.0),
    ), common.tiny_lm_base(seq_len=128, batch_size=32))
