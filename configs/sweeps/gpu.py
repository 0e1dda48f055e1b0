"""The GPU IsoFLOP sweep: 6 budgets (1e16–1.5e18 FLOPs) × 6 models up to ~3e8 parameters, about a day
on one H100 (the dry run's estimate assumes 40% MFU of the H100's 989 TFLOP/s bf16 peak).

python -m experiments.sweep --config=configs/sweeps/gpu.py --workdir=DIR [--dry_run] [--launcher=slurm]
LLaMA-shaped models (RoPE, RMSNorm, SwiGLU, untied head), head_dim 64, bf16 compute, seq_len 1024,
an 8k SentencePiece vocabulary (with 32k the embeddings of the smallest models outweigh their blocks); the batch grows as C^0.25 from 64 sequences at the smallest budget.
The largest runs read billions of tokens: point base.data.tfds_name at a large text dataset
(the built-in stdlib corpus would be repeated many times).
"""
from __future__ import annotations

import ml_collections

from configs import lm
from configs.sweeps import common

H100_BF16_PEAK = 989e12


def get_config() -> ml_collections.ConfigDict:
    base = lm.get_config("llama_small")
    base.data.tokenizer = "sentencepiece"
    base.data.vocab_size = 8192
    base.data.seq_len = 1024
    base.data.worker_count = 4
    base.train.batch_size = 64
    base.train.compute_dtype = "bfloat16"
    base.train.eval_steps = 16
    base.train.weight_decay = 0.1
    return common.make(dict(
        name="gpu",
        budgets=(1e16, 3e16, 1e17, 2.5e17, 6e17, 1.5e18),
        d_models=(128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1152, 1280, 1536, 1792, 2048),
        head_dim=64, aspect_ratio=64.0, ffn_ratio=8.0 / 3.0, ffn_multiple=64,
        sizes_per_budget=6, size_span=6.0,
        lr_coefficient=0.3, lr_exponent=-0.25, lr_max=3e-3,
        warmup_fraction=0.02, warmup_min=100,
        batch_size_exponent=0.25, batch_multiple=16,
        evals_per_run=8, checkpoints_per_run=10, logs_per_run=100,
        estimate_flops_per_second=0.4 * H100_BF16_PEAK, estimate_step_overhead_s=0.002,
        estimate_run_overhead_s=120.0,
        slurm=dict(time="24:00:00", gpus_per_task=1, cpus_per_task=16, mem="120G"),
    ), base)
