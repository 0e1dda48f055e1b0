"""The GPU quick IsoFLOP sweep: end to end on ONE H100 in at most 6 minutes of device time, compilation included
(issue 30 §1): 3 budgets × 4 sizes, the fit, and the prediction at 4× the largest budget, written before its run
trains and then checked (DIR/fit/predictions.json, DIR/fit/validation.json).

python -m experiments.sweep --config=configs/sweeps/gpu_quick.py --workdir=DIR [--dry_run] \\
    [--config.base.data.files='.data/*.jsonl.gz']
python -m experiments.sweep --config=configs/sweeps/gpu_quick.py:cpu --workdir=DIR   # the same sweep, shrunk
bash .ci/gpu_stages/gpu_quick.sh                                                    # on the device (OUT=...)

Models: LLaMA-shaped (RoPE, RMSNorm, SwiGLU, no biases; one KV head per query head) at a fixed depth of 8, head_dim
32, widths 32–512 in steps of 32, bf16 compute, seq_len 512, 64 sequences (32,768 tokens) per step, with the
embedding tied to the head (as LLaMA 3.2's small models) and a BPE vocabulary of 8,192 pieces trained on the data
(data.tokenizer="sentencepiece"; or --config.base.data.tokenizer=PATH/tokenizer.json). Every run keeps at least half
of its parameters outside the embeddings (sweep.min_non_embedding_fraction=0.5, spec/accounting's non_embedding):
with 8,192 pieces d32 and d64 (non-embedding 23%, 43% of N) are left out with a note, d96 (1.67M parameters, 53%)
is the smallest shape; the validation run's shape obeys it too. The budgets follow from that shape (sweep.budgets
empty): the smallest 2×-spaced budgets whose 4 sizes straddle the prior optimum (20 tokens per parameter) with at
least 200 steps each, 4.1e14, 8.19e14 and 1.64e15 FLOPs, the prediction checked at 6.56e15 (4× the largest).
Warm-up–stable–decay runs (20% decay) that branch from the previous budget's decay start, budgets 2–3 re-centred
on the minima found so far, AdamW β2 = 0.99, weight decay 0.1, warm-up of N tokens (Porian et al. 2024).

Learning rate: carried, not calibrated: gpu.py's prior 0.25·N^-0.3 capped at 3e-3 (3.0e-3 at 1.7M parameters,
2.3e-3 at 6.5M). A calibration (gpu.py's: 2 sizes × 3 rates) adds 6 runs to these 13, about 1.7 minutes by the
estimate below, which the 6 minutes do not hold. The carried rule sits within 1.5× below DeepSeek's fitted
η_opt = 0.3118·C^-0.125 at these budgets (4.7e-3 at 4e14, 3.3e-3 at 6.6e15, for batches of 17k–44k tokens, its
B_opt = 0.292·C^0.327, around the 32k used here); both are extrapolations to this scale. A measured rule replaces
it: --config.sweep.lr_fit=DIR/lr_fit.json (an LR scan, configs/sweeps/lr_scan.py), or
--config.sweep.lr_calibration.d_models=96,192 (over the time limit unless sweep.max_hours is raised).

Time: sweep.max_hours = 0.1 (6 minutes), compilation and set-up included; the dry run prints the estimate and a plan
estimated above the limit is one error (exit 2) naming both. The rates are the device's own (H100_MEASURED below:
the 13 runs of this sweep on one H100, one at a time, 2026-11-26). With them one run after another takes an
estimated 6.4 minutes and does not fit; the sweep's default on a GPU (--parallel=0) has the runs of each stage share
it in worker processes (transformer/sweeps/packing.py), and the limit bounds that packed estimate, stage by stage
(design/estimate.py), about 4 minutes. A dry run without a GPU assumes one of estimate_device_memory_gb=80, as the
H100; estimate_pack_overlap=0 (no share of a step's overhead filled by the other workers: not measured yet, so the
device is counted busy for all of each step).

Data: the built-in corpus (the device builds it from its own Python's standard library, ~30 MB, ~10M tokens with
8,192 pieces) is read many times by the larger runs (the dry run prints the epochs of every run and the most in each
stage once the data is tokenized). Point the sweep at more text with
--config.base.data.files='DIR/*.jsonl.gz' (comma-separated globs of .txt, .jsonl, .jsonl.gz, .parquet; a folder
carried to the device machine: docs/recipe-one-gpu.md, "The gpu_quick sweep on a lent GPU").

`:cpu` (configs/sweeps/gpu_quick.py:cpu): the same sweep with its shapes shrunk for 2 CPU cores, so every path the
device run takes (SentencePiece trained on the data, tied LLaMA blocks in bf16, the non-embedding floor, chosen
budgets under the time limit, branching, re-centring, the prediction and its check) runs in the slow tests: a
384-piece vocabulary, depth 3, head_dim 8, widths 8–128, seq_len 64, 16 sequences per step, at least 100 steps a
run, its rates measured on the 2-core CPU and a limit of 15 minutes (the whole sweep took 9.2 minutes there at
load ~5: 13 runs of 15k-100k parameters, 10 s of compilation each).
"""
from __future__ import annotations

import ml_collections

from configs import lm
from configs.sweeps import common
from transformer.spec import ConfigError

# The H100 rates the estimate uses, measured by this sweep's own run on one NVIDIA H100 80GB HBM3 (2026-11-26, jax
# 0.11.2, 13 runs one at a time; docs/figures/gpu_quick_h100/gpu_quick_summary.txt, the fit of each run's
# train_seconds = steps·(FLOPs/R + t0) + c and the medians of its summary.json times; docs/results/
# 2026-11-26-gpu-quick-h100.md). They replace the estimates from the 1B and GPT-2 small benches (R = 4.43e14, 9.54 ms
# per step, 6 s compilation, 3 s per run, 30 s set-up), which put the sweep at 4.5 minutes where its runs took 6.2.
H100_MEASURED = dict(
    estimate_flops_per_second=2.89e14,  # R, sustained (29% of the bf16 peak) at 1.7M-54M parameters, 32k tokens/step
    estimate_step_overhead_s=0.0108,    # t0 per step at 8 layers (1.35 ms per layer): small kernels, launches
    estimate_compile_s=7.9,             # per run, median (7-12 s: the first run of each shape compiles cold)
    estimate_run_overhead_s=5.1,        # per run besides steps and compilation: evaluation 2.38 s + the rest 2.76 s
    estimate_setup_s=10.0,              # once: the sweep command's time outside its runs (start-up, designs, fits)
    estimate_source="measured: this sweep on one H100 80GB HBM3, 13 runs one at a time, 2026-11-26 "
                    "(docs/figures/gpu_quick_h100/gpu_quick_summary.txt)",
)


def get_config(variant: str = "") -> ml_collections.ConfigDict:
    if variant not in ("", "cpu"):
        raise ConfigError(f"unknown variant {variant!r} for configs/sweeps/gpu_quick.py; valid: cpu (the shapes "
                          f"shrunk for 2 CPU cores), or none (the H100 sweep)")
    cpu = variant == "cpu"
    base = lm.get_config("llama_small")
    base.model.tie_embeddings = True
    base.data.tokenizer = "sentencepiece"
    base.data.vocab_size = 384 if cpu else 8192
    base.data.seq_len = 64 if cpu else 512
    base.data.worker_count = 0  # read threads: 13M tokens/s (BENCHMARKS.md), no worker processes to start per run
    base.train.batch_size = 16 if cpu else 64
    base.train.compute_dtype = "bfloat16"
    base.train.eval_steps = 8                  # 8 × 32,768 tokens: about the whole held-out split of the built-in corpus
    base.train.weight_decay = 0.1
    base.train.b2 = 0.99
    base.train.schedule = "wsd"
    base.train.decay_fraction = 0.2
    base.train.final_lr_fraction = 0.0
    num_layers = 3 if cpu else 8
    if cpu:  # measured by this variant's own run on the shared 2-core CPU VM (load ~5), 2026-11-27; one process
        estimate = dict(estimate_flops_per_second=1.8e10, estimate_step_overhead_s=0.009,
                        estimate_run_overhead_s=3.0, estimate_compile_s=10.0, estimate_setup_s=45.0,
                        estimate_source="measured on the shared 2-core CPU VM, 2026-11-27 (.ci/gpu_stages/"
                                        "gpu_quick_summary.py)")
    else:  # the runs share the GPU (--parallel=0); a dry run without one assumes an H100's 80 GB
        estimate = dict(**H100_MEASURED, estimate_device_memory_gb=80.0, estimate_pack_overlap=0.0)
    return common.make(dict(
        name="gpu_quick_cpu" if cpu else "gpu_quick",
        budgets=(),          # chosen by the sweep (design/budgets.py): 4.1e14, 8.19e14, 1.64e15 with 8,192 pieces
        max_hours=0.25 if cpu else 0.1,  # 6 minutes of device time, compilation and set-up included (2 CPU cores: 15)
        d_models=tuple(range(8, 129, 8)) if cpu else tuple(range(32, 513, 32)),
        num_layers=num_layers, head_dim=8 if cpu else 32, ffn_ratio=8.0 / 3.0, ffn_multiple=8 if cpu else 32,
        min_non_embedding_fraction=0.5,
        sizes_per_budget=4, min_sizes=4, size_span=6.0, prior_tokens_per_param=20.0, recenter=True,
        lr_coefficient=0.25, lr_exponent=-0.3, lr_max=3e-3,
        warmup_tokens_per_param=1.0, warmup_min=10, min_steps=100 if cpu else 200, branch=True,
        validate_ratio=4.0,  # the prediction checked at 4× the largest budget
        evals_per_run=1, checkpoints_per_run=1, logs_per_run=10,  # and the decay start's, which a branch continues
        **estimate,
    ), base)
