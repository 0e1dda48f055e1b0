"""The GPU IsoFLOP sweep: 6 budgets (1e16–1.5e18 FLOPs) with sizes up to ~4e8 parameters and the prediction
checked at 6e18, about a day on one H100 (the dry run's estimate assumes 40% MFU of its 989 TFLOP/s bf16 peak).

python -m experiments.sweep --config=configs/sweeps/gpu.py --workdir=DIR [--dry_run] [--launcher=slurm]
The cpu sweep's design (configs/sweeps/cpu.py) at GPU scale: LLaMA-shaped models (RoPE, RMSNorm, SwiGLU, untied
head) at a fixed depth of 8 with head_dim 64 and width 128–2048 in steps of 64 (no depth jumps inside an IsoFLOP
curve; ≤ 0.4 in ln N between neighbours from d256), bf16 compute, seq_len 1024, an 8k SentencePiece vocabulary (with 32k the embeddings of the
smallest models outweigh their blocks); 32 sequences per batch at every budget (a branch continues its source's
data and batch), AdamW β2 = 0.99 (Porian et al. 2024 for small models); warm-up of N tokens; learning rate c·N^-0.3 (2e-3 at 1e7 parameters, 8e-4 at 2e8) with c calibrated at the first budget;
wsd runs branching from the previous budget's decay start; budgets re-centred on the minima found so far;
3 sizes under 2 more seeds; the prediction at 4× the largest budget written before its model trains. Not run
here (no GPU was lent to this project's sessions so far).
The largest runs read billions of tokens: point base.data.tfds_name or base.data.files at a large text dataset
(the built-in stdlib corpus would be repeated many times; `--dry_run` warns where data repeats).
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
    base.train.batch_size = 32
    base.train.compute_dtype = "bfloat16"
    base.train.eval_steps = 16
    base.train.weight_decay = 0.1
    base.train.b2 = 0.99
    base.train.schedule = "wsd"
    base.train.decay_fraction = 0.2
    base.train.final_lr_fraction = 0.0
    return common.make(dict(
        name="gpu",
        budgets=(1e16, 3e16, 1e17, 2.5e17, 6e17, 1.5e18),
        d_models=tuple(range(128, 2049, 64)),
        num_layers=8, head_dim=64, ffn_ratio=8.0 / 3.0, ffn_multiple=64,
        sizes_per_budget=6, size_span=6.0, prior_tokens_per_param=20.0, recenter=True,
        lr_coefficient=0.25, lr_exponent=-0.3, lr_max=3e-3,
        lr_calibration=dict(d_models=(384, 768), multipliers=(0.5, 1.0, 2.0)),
        warmup_tokens_per_param=1.0, warmup_min=100, min_steps=1000, branch=True,
        seeds=dict(extra=2, sizes=3),
        validate_flops=6e18,
        evals_per_run=8, checkpoints_per_run=10, logs_per_run=100,
        estimate_flops_per_second=0.4 * H100_BF16_PEAK, estimate_step_overhead_s=0.002,
        estimate_run_overhead_s=120.0,
        # several runs on one GPU (docs/sweeps.md): an H100's 80 GB for the dry run where no GPU is visible, and no
        # overlap of the step overhead assumed until .ci/gpu_stages/pack.sh has measured it (a prior, 2026-11-27)
        estimate_device_memory_gb=80.0, estimate_pack_overlap=0.0,
        slurm=dict(time="24:00:00", gpus_per_task=1, cpus_per_task=16, mem="120G"),
    ), base)
