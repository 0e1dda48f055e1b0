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

Time: sweep.max_hours = 0.1 (6 minutes); the dry run prints the estimate and a plan estimated above the limit is
one error (exit 2) naming both. The rates are ESTIMATES from the only H100 measurements so far, to be replaced by
the device's own (.ci/gpu_stages/gpu_quick.sh prints the fitted rates of its runs): H100_MEASURED below.

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

H100_BF16_PEAK = 989e12  # FLOP/s, H100 SXM dense bf16

# The H100 measurements the estimate is derived from: BENCHMARKS.md, "GPU: one H100, 2026-11-26" (one NVIDIA H100
# 80GB HBM3, jax 0.11.2, bf16, experiments.bench medians): (layers, training FLOPs per step with attention,
# seconds per step), both at 16,384 tokens per step.
H100_MEASURED = {
    "llama_1b": (16, 5.7378e9 * 16384, 16384 / 70_781),        # 0.89B, seq 2048 × 8: 41.1% MFU, 231 ms per step
    "gpt2_small": (12, 6.2462e8 * 16384, 16384 / 437_725),     # 86M, seq 1024 × 16: 27.7% MFU, 37 ms per step
}


def step_model(measured: dict = H100_MEASURED) -> tuple[float, float]:
    """(R, τ) of the rate model "seconds per step = FLOPs per step / R + layers · τ" through the two measurements:
    a sustained matmul rate plus a fixed cost per layer and step (kernel launches and memory-bound work that small
    widths do not amortise), so MFU falls with model size as measured (41% at 0.89B, 28% at 86M). It gives
    R = 4.43e14 FLOP/s (44.8% of peak) and τ = 1.19 ms; the third measurement (0.89B at 32,768 tokens per step,
    435 ms) it predicts at 444 ms (+2%). For the models here (d96–d224, 8 layers, 32,768 tokens per step) it
    predicts 5–13% MFU: an extrapolation 10–50× below the measured sizes."""
    (l1, f1, t1), (l2, f2, t2) = measured.values()
    inv_r = (t1 * l2 - t2 * l1) / (f1 * l2 - f2 * l1)
    return 1.0 / inv_r, (t1 - f1 * inv_r) / l1


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
    rate, per_layer = step_model()
    if cpu:  # measured by this variant's own run on the shared 2-core CPU VM (load ~5), 2026-11-27
        estimate = dict(estimate_flops_per_second=1.8e10, estimate_step_overhead_s=0.009,
                        estimate_run_overhead_s=3.0, estimate_compile_s=10.0, estimate_setup_s=45.0,
                        estimate_source="measured on the shared 2-core CPU VM, 2026-11-27 (.ci/gpu_stages/"
                                        "gpu_quick_summary.py)")
    else:
        estimate = dict(
            estimate_flops_per_second=rate, estimate_step_overhead_s=num_layers * per_layer,
            # compilation of each run's train and eval steps: 3-8 s at 0.89B on the H100 (BENCHMARKS.md), 8 layers here
            estimate_compile_s=6.0,
            estimate_run_overhead_s=3.0,  # model init, data pipeline start, eval, 2-3 checkpoints of a small state
            estimate_setup_s=30.0,        # JAX and CUDA start-up, the SentencePiece model and token cache, two fits
            estimate_source=f"ESTIMATES from one H100 80GB HBM3, 2026-11-26 (BENCHMARKS.md: llama_1b 41%, GPT-2 "
                            f"small 28% MFU), R + {num_layers} layers x tau per step; replace with the device's")
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
