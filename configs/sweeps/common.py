"""Settings shared by every sweep: the `sweep` section (grid design, rules, runner, SLURM) and `base`.

A sweep config is a ConfigDict with two sections:
  sweep  how to expand the sweep into runs (IsoFLOP grid or LR scan) and how to run them
  base   a full training config (configs/lm.py); every run is `base` with its shape, steps, learning
         rate, warm-up and batch size filled in by transformer/design/grid.py
Both are overridable from the command line: --config.sweep.budgets=1e11,3e11 --config.base.train.batch_size=32.

IsoFLOP grid (Hoffmann et al. 2022, approach 2): for each budget C, `sizes_per_budget` shapes from the
ladder, log-evenly spaced over a factor `size_span` in N around the prior optimum N_opt(C); each gets
D = C / flops_per_token tokens (the training loop's own FLOP accounting, attention included), so the
logged FLOPs of one IsoFLOP group are equal up to the rounding of steps.
"""
from __future__ import annotations

import ml_collections

from configs import lm
from transformer.design.defaults import MODES, PARAM_COUNTS, sweep_defaults  # noqa: F401 (re-exported)

def tiny_lm_base(seq_len: int, batch_size: int) -> ml_collections.ConfigDict:
    """A GPT-2-shaped decoder on the built-in corpus with the byte tokenizer (the CPU sweeps' base)."""
    base = lm.get_config("gpt2_tiny")
    base.data.tokenizer = "bytes"
    base.data.seq_len = seq_len
    base.train.batch_size = batch_size
    base.train.schedule = "cosine"
    base.train.final_lr_fraction = 0.1
    base.train.eval_steps = 32   # 32 batches, shuffled across the validation split: low-noise IsoFLOP points
    return base


def make(sweep_overrides: dict, base: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The sweep config: defaults updated with `sweep_overrides` (unknown keys are caught by design/spec.py)."""
    c = ml_collections.ConfigDict()
    c.sweep = ml_collections.ConfigDict(sweep_defaults())
    lr_scan = sweep_overrides.pop("lr_scan", None)
    slurm = sweep_overrides.pop("slurm", None)
    c.sweep.update(sweep_overrides)
    if lr_scan:
        c.sweep.lr_scan.update(lr_scan)
    if slurm:
        c.sweep.slurm.update(slurm)
    c.base = base
    return c
