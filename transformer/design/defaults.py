"""Every key a sweep config's `sweep` section may have, with its default (the one source of them).

configs/sweeps/*.py start from `sweep_defaults()` and override what they need; transformer/design/grid.py
rejects any key not listed here. The `base` section is a full training config (configs/lm.py).
"""
from __future__ import annotations

import ml_collections

MODES = ("isoflop", "lr_scan")
PARAM_COUNTS = ("total", "non_embedding")


def sweep_defaults() -> ml_collections.ConfigDict:
    """Every key a `sweep` section may have, with its default; anything else is a ConfigError."""
    s = ml_collections.ConfigDict()
    s.name = "sweep"
    s.mode = "isoflop"                 # isoflop | lr_scan
    s.budgets = (1e11, 3e11, 1e12)     # compute budgets C in FLOPs (tokens × flops_per_token with attention)

    # The shape ladder: one model per d_model; num_layers = clip(round(d_model / aspect_ratio)),
    # num_heads = d_model / head_dim, d_ff = ffn_ratio · d_model rounded to a multiple of ffn_multiple.
    s.d_models = (32, 48, 64, 96, 128)
    s.num_layers = 0                   # > 0: every shape has this depth and only the width varies (no depth
                                       # jumps inside an IsoFLOP curve); 0: depth from aspect_ratio
    s.aspect_ratio = 32.0              # d_model / num_layers
    s.min_layers = 1
    s.max_layers = 64
    s.head_dim = 32
    s.ffn_ratio = 4.0
    s.ffn_multiple = 8

    # Which sizes each budget gets: around the prior optimum N_opt = G · C^a, evenly spaced in log N.
    s.param_count = "total"            # total | non_embedding: the N of the prior, spacing, LR rule and fits
    s.sizes_per_budget = 4
    s.size_span = 10.0                 # largest / smallest N within a budget
    s.prior_exponent = 0.5             # a in N_opt = G · C^a
    s.prior_tokens_per_param = 20.0    # G = (6 · tokens_per_param)^-a when prior_coefficient is 0
    s.prior_coefficient = 0.0
    s.recenter = False                 # centre each budget on the power law through the finished budgets'
                                       # minima (the prior only for the first); a budget is then designed once
                                       # the budgets before it have finished
    s.grid_from = ""                   # DIR of a baseline IsoFLOP sweep: each budget trains that sweep's grid
                                       # sizes (same d_model) instead of its own, so experiments.compare can pair
                                       # the two sweeps (a variant at matched shapes); its own LR calibration
    s.min_steps = 20                   # a run with fewer steps is dropped (or the budget is an error)
    s.min_sizes = 3                    # a budget with fewer sizes left is an error

    # Per-run rules.
    s.lr_coefficient = 0.05            # peak learning rate = lr_coefficient · N^lr_exponent ...
    s.lr_exponent = -0.25
    s.lr_max = 1e-2                    # ... capped here
    s.lr_fit = ""                      # a DIR/lr_fit.json from an LR scan replaces the two numbers above
    s.warmup_fraction = 0.05           # warm-up = max(warmup_min, warmup_fraction · steps), at most steps / 2
    s.warmup_min = 10
    s.warmup_tokens_per_param = 0.0    # > 0: warm-up = this · N tokens instead (Porian et al. 2024: 1), N alone
    s.branch = False                   # base.train.schedule=wsd: a size's run at a budget continues from the
                                       # decay start of its run at the previous budget (Hägele et al. 2024)
    s.batch_size_exponent = 0.0        # batch = base batch · (C / smallest budget)^exponent ...
    s.batch_multiple = 8               # ... rounded to a multiple of this (0 exponent: the base batch)
    s.micro_batch_size = 0             # >0: a run's batch above this many rows is accumulated in micro-batches
                                       # of at most this many (train.grad_accum_steps); 0: never
    s.validate_flops = 0.0             # > 0: after the grid, predict the compute-optimal model and its loss at
                                       # this budget (DIR/fit/predictions.json), train it, DIR/fit/validation.json

    # The learning rate from measurement: a calibration stage before the budgets. Each size trains at the
    # smallest budget's compute (the sweep's tokens per parameter) at the rule's rate × each multiplier
    # (extended where a size's best rate is at the edge); lr_opt = c·N^k is refitted from the optima
    # (k = lr_exponent held unless fit_exponent), and every later run uses it.
    s.lr_calibration = ml_collections.ConfigDict()
    s.lr_calibration.d_models = ()     # empty: no calibration
    s.lr_calibration.multipliers = (0.5, 1.0, 2.0)
    s.lr_calibration.max_extensions = 2
    s.lr_calibration.fit_exponent = False

    # Seed replicates: the `sizes` runs nearest the optimum of each budget in `budgets` (empty: the smallest)
    # train again under `extra` more seeds; the fits take σ from their spread.
    s.seeds = ml_collections.ConfigDict()
    s.seeds.extra = 0
    s.seeds.budgets = ()
    s.seeds.sizes = 3

    # Schedule check: the grid runs of one budget trained again under another schedule (e.g. wsd against
    # cosine), reported in DIR/fit/schedule_check.json and not fitted.
    s.schedule_check = ml_collections.ConfigDict()
    s.schedule_check.budget = 0.0      # 0: off
    s.schedule_check.schedule = "cosine"
    s.schedule_check.sizes = 0         # the sizes nearest the budget's centre that are checked; 0: all

    s.evals_per_run = 1                # evaluations spread over each run (the last one at its end)
    s.checkpoints_per_run = 4          # checkpoints spread over each run (resume granularity)
    s.logs_per_run = 10
    s.fit_bootstrap = 200              # bootstrap resamples for the fit's 95% intervals at the end of the sweep
    s.max_retries = 1                  # a run that raises is retried (resuming) this many times, then recorded failed
    s.claim_timeout_s = 600.0          # a run claim not refreshed for this long (its runner died) may be taken over
    s.multirun = False                 # train runs that differ only in learning rate or seed (an LR scan's
                                       # sizes) as one vmapped program; one device, --parallel=1, no SLURM.
                                       # Off: slower on the 2-core CPU (BENCHMARKS.md), meant for a GPU.

    # Time estimate printed by --dry_run: per run, steps × (tokens_per_step · flops_per_token /
    # estimate_flops_per_second + estimate_step_overhead_s) + estimate_run_overhead_s.
    s.estimate_flops_per_second = 2.5e10
    s.estimate_step_overhead_s = 0.004
    s.estimate_run_overhead_s = 8.0

    # LR scan (mode lr_scan): each size trained at `num_lrs` peak learning rates log-spaced over
    # [lr_min, lr_max], on tokens_per_param · N tokens (or a fixed `tokens` when nonzero).
    s.lr_scan = ml_collections.ConfigDict()
    s.lr_scan.d_models = (32, 64, 96)
    s.lr_scan.lr_min = 1e-3
    s.lr_scan.lr_max = 3e-2
    s.lr_scan.num_lrs = 5
    s.lr_scan.tokens_per_param = 20.0
    s.lr_scan.tokens = 0

    # --launcher=slurm: a job array, one task per run.
    s.slurm = ml_collections.ConfigDict()
    s.slurm.time = "04:00:00"
    s.slurm.gpus_per_task = 1
    s.slurm.cpus_per_task = 8
    s.slurm.mem = ""                   # e.g. "64G"; "" leaves it to the cluster
    s.slurm.partition = ""
    s.slurm.account = ""
    s.slurm.max_parallel = 0           # array throttle (%K); 0: no limit
    s.slurm.setup = ""                 # shell lines run before the worker (module load, venv activation)
    return s
