"""Sweep design: a sweep config (configs/sweeps/) → the list of runs, each a full training config.

IsoFLOP mode: for each budget C, shapes from the ladder log-evenly spaced around the prior optimum
N_opt = G·C^a; each gets steps = round(C / (flops_per_token · batch · seq_len)), so its logged FLOPs
(tokens × flops_per_token "with_attention", the loop's own accounting) equal C up to that rounding.
LR-scan mode: a few shapes, each at a log grid of peak learning rates, on a fixed token count.

Every run's learning-rate schedule spans exactly its steps; the warm-up is a fraction of them (with a
floor). A run's id is `<shape>-<C or lr>-<8 hex of sha1 of its canonical config JSON>`, so the same
settings always give the same id and any change gives a new one. No JAX computation happens here.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any, Callable

import ml_collections
import numpy as np

from transformer.sweeps.defaults import MODES, PARAM_COUNTS, sweep_defaults
from transformer.models.config import ConfigError, MissingInputError
from transformer.scaling.accounting import flops_per_token, param_counts
from transformer.training import validate

# Settings that say where or how a run executes, not what it computes: left out of the run id.
_ENVIRONMENT_KEYS = ("data.data_dir", "data.cache_dir", "data.worker_count", "distributed", "logging")


@dataclasses.dataclass(frozen=True)
class Shape:
    d_model: int
    num_layers: int
    num_heads: int
    head_dim: int
    d_ff: int

    @property
    def name(self) -> str:
        return f"d{self.d_model}-L{self.num_layers}"


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a sweep: its design numbers and its full training config."""

    run_id: str
    index: int
    shape: Shape
    budget: float | None         # the nominal C of its IsoFLOP group (None in an LR scan)
    params: int
    params_non_embedding: int
    size: int                    # N as the sweep counts it (sweep.param_count)
    flops_per_token: float
    steps: int
    batch_size: int
    seq_len: int
    learning_rate: float
    warmup_steps: int
    config: ml_collections.ConfigDict

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.seq_len

    @property
    def flops(self) -> float:
        return self.tokens * self.flops_per_token

    def describe(self) -> dict[str, Any]:
        """The design numbers (everything but the config), as written to sweep.json and results.jsonl."""
        return {"run_id": self.run_id, "index": self.index, "budget": self.budget, "params": self.params,
                "params_non_embedding": self.params_non_embedding, "size": self.size,
                "tokens": self.tokens, "flops": self.flops, "flops_per_token": self.flops_per_token,
                "steps": self.steps, "batch_size": self.batch_size, "seq_len": self.seq_len,
                "learning_rate": self.learning_rate, "warmup_steps": self.warmup_steps,
                **dataclasses.asdict(self.shape)}


def format_flops(c: float) -> str:
    """1e11 → "1e11", 2.5e17 → "2.5e17" (compact, for run ids and tables)."""
    mantissa, _, exponent = f"{c:.3g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def run_id(label: str, config: ml_collections.ConfigDict) -> str:
    """`label-<8 hex>`: sha1 of the canonical JSON of the config without its environment keys."""
    d = json.loads(json.dumps(config.to_dict()))
    for key in _ENVIRONMENT_KEYS:
        *parents, last = key.split(".")
        holder = d
        for p in parents:
            holder = holder.get(p, {})
        holder.pop(last, None)
    canonical = json.dumps(d, sort_keys=True, separators=(",", ":"))
    return f"{label}-{hashlib.sha1(canonical.encode()).hexdigest()[:8]}"


def _check_keys(section: Any, defaults: ml_collections.ConfigDict, prefix: str) -> None:
    unknown = sorted(set(section.keys()) - set(defaults.keys()))
    if unknown:
        raise ConfigError(f"unknown sweep setting(s) {', '.join(prefix + k for k in unknown)}; valid: "
                          f"{', '.join(prefix + k for k in sorted(defaults.keys()))}")
    for k in defaults.keys():
        if isinstance(defaults[k], ml_collections.ConfigDict):
            _check_keys(section[k], defaults[k], f"{prefix}{k}.")


def validate_sweep(config: ml_collections.ConfigDict) -> None:
    """Checks the sweep section's keys and values; raises ConfigError naming the setting."""
    if "sweep" not in config or "base" not in config:
        raise ConfigError("a sweep config needs a `sweep` section and a `base` training config "
                          "(see transformer/sweeps/defaults.py)")
    s = config.sweep
    _check_keys(s, sweep_defaults(), "sweep.")
    if s.mode not in MODES:
        raise ConfigError(f"sweep.mode={s.mode!r} is not valid; choose one of {', '.join(MODES)}")
    if s.param_count not in PARAM_COUNTS:
        raise ConfigError(f"sweep.param_count={s.param_count!r} is not valid; choose one of {', '.join(PARAM_COUNTS)}")
    for name in ("head_dim", "min_layers", "max_layers", "sizes_per_budget", "min_steps", "min_sizes",
                 "batch_multiple", "evals_per_run", "checkpoints_per_run", "logs_per_run"):
        if not isinstance(s[name], int) or s[name] <= 0:
            raise ConfigError(f"sweep.{name}={s[name]!r} must be a positive integer")
    if s.min_sizes < 3:
        raise ConfigError(f"sweep.min_sizes={s.min_sizes} must be at least 3 (a parabola needs three points)")
    if s.sizes_per_budget < s.min_sizes:
        raise ConfigError(f"sweep.sizes_per_budget={s.sizes_per_budget} is below sweep.min_sizes={s.min_sizes}: "
                          f"each IsoFLOP curve needs at least {s.min_sizes} sizes")
    if not s.size_span > 1:
        raise ConfigError(f"sweep.size_span={s.size_span!r} must be > 1 (largest / smallest N in a budget)")
    if not 0 <= s.warmup_fraction < 1:
        raise ConfigError(f"sweep.warmup_fraction={s.warmup_fraction!r} must be in [0, 1)")
    if s.mode == "isoflop":
        budgets = list(s.budgets)
        if not budgets or any(not (isinstance(c, (int, float)) and c > 0) for c in budgets):
            raise ConfigError(f"sweep.budgets={tuple(budgets)} must be a non-empty list of positive FLOP counts")
        if len(set(budgets)) != len(budgets):
            raise ConfigError(f"sweep.budgets={tuple(budgets)} has repeated budgets")
    else:
        scan = s.lr_scan
        if scan.num_lrs < 3:
            raise ConfigError(f"sweep.lr_scan.num_lrs={scan.num_lrs}: an LR scan needs at least 3 learning "
                              f"rates per size (the optimum is a parabola through the best point and its neighbours)")
        if not 0 < scan.lr_min < scan.lr_max:
            raise ConfigError(f"sweep.lr_scan.lr_min={scan.lr_min!r} and lr_max={scan.lr_max!r} must satisfy "
                              f"0 < lr_min < lr_max")
        if len(scan.d_models) < 2:
            raise ConfigError(f"sweep.lr_scan.d_models={tuple(scan.d_models)}: fitting lr_opt = c·N^k needs at "
                              f"least 2 sizes")


def vocab_size(base: ml_collections.ConfigDict) -> int:
    """The vocabulary the runs will have: model.vocab_size, else the tokenizer's (without training one)."""
    if base.model.vocab_size:
        return int(base.model.vocab_size)
    if base.data.tokenizer == "bytes":
        from transformer.data.tokenizers import ByteTokenizer
        return ByteTokenizer().vocab_size
    if base.data.tokenizer == "sentencepiece":
        return int(base.data.vocab_size)
    raise ConfigError(f"base.data.tokenizer={base.data.tokenizer!r} is not valid; choose bytes or sentencepiece")


def shape_for(sweep: ml_collections.ConfigDict, d_model: int) -> Shape:
    """The ladder's rule: depth from the aspect ratio, heads from the fixed head_dim, d_ff from the ratio."""
    if d_model % sweep.head_dim:
        raise ConfigError(f"d_model={d_model} is not a multiple of sweep.head_dim={sweep.head_dim}; "
                          f"use d_models that are multiples of {sweep.head_dim}")
    layers = int(np.clip(round(d_model / sweep.aspect_ratio), sweep.min_layers, sweep.max_layers))
    d_ff = max(sweep.ffn_multiple, int(round(sweep.ffn_ratio * d_model / sweep.ffn_multiple)) * sweep.ffn_multiple)
    return Shape(d_model=d_model, num_layers=layers, num_heads=d_model // sweep.head_dim,
                 head_dim=sweep.head_dim, d_ff=d_ff)


def run_config(base: ml_collections.ConfigDict, sweep: ml_collections.ConfigDict, shape: Shape, vocab: int,
               steps: int = 1, learning_rate: float = 1e-3, batch_size: int | None = None) -> ml_collections.ConfigDict:
    """`base` with the shape, steps, schedule and batch of one run filled in."""
    c = ml_collections.ConfigDict(base.to_dict())
    c.model.update(dict(d_model=shape.d_model, num_layers=shape.num_layers, num_heads=shape.num_heads,
                        num_kv_heads=0, head_dim=shape.head_dim, d_ff=shape.d_ff, vocab_size=vocab))
    if c.model.positional in ("learned", "sinusoidal"):
        c.model.max_len = c.data.seq_len  # no unused position-table rows inflating N
    warmup = min(max(sweep.warmup_min, round(sweep.warmup_fraction * steps)), steps // 2)
    c.train.update(dict(
        steps=steps, learning_rate=float(learning_rate), warmup_steps=warmup,
        batch_size=batch_size or c.train.batch_size,
        eval_every=max(1, math.ceil(steps / sweep.evals_per_run)),
        checkpoint_every=max(1, math.ceil(steps / sweep.checkpoints_per_run)),
        log_every=max(1, steps // sweep.logs_per_run)))
    return c


def measure(config: ml_collections.ConfigDict, vocab: int) -> dict[str, float]:
    """params, params_non_embedding and flops_per_token (with attention) of a run config's model."""
    cfg = validate.model_config(config, vocab)
    counts = param_counts(cfg)
    return {"params": counts["total"], "params_non_embedding": counts["non_embedding"],
            "flops_per_token": flops_per_token(cfg, config.data.seq_len)["with_attention"]}


def _size(m: dict[str, float], sweep: ml_collections.ConfigDict) -> int:
    return int(m["params"] if sweep.param_count == "total" else m["params_non_embedding"])


def prior_optimum(sweep: ml_collections.ConfigDict, budget: float) -> float:
    """N_opt = G · C^a; G = (6 · tokens_per_param)^-a unless sweep.prior_coefficient is set."""
    a = sweep.prior_exponent
    g = sweep.prior_coefficient or (6.0 * sweep.prior_tokens_per_param) ** -a
    return g * budget ** a


def lr_rule(sweep: ml_collections.ConfigDict) -> Callable[[float], float]:
    """N → peak learning rate: c·N^k (from sweep.lr_fit when set), capped at sweep.lr_max."""
    c, k = sweep.lr_coefficient, sweep.lr_exponent
    if sweep.lr_fit:
        try:
            with open(sweep.lr_fit) as f:
                fit = json.load(f)
        except FileNotFoundError:
            raise MissingInputError(f"sweep.lr_fit={sweep.lr_fit!r}: no such file (an LR scan writes DIR/lr_fit.json)")
        if fit.get("param_count", "total") != sweep.param_count:
            raise ConfigError(f"sweep.lr_fit={sweep.lr_fit!r} was fitted against {fit.get('param_count')} params but "
                              f"sweep.param_count={sweep.param_count!r}")
        c, k = float(fit["coefficient"]), float(fit["exponent"])
    return lambda n: float(min(sweep.lr_max, c * n ** k))


def _pick_sizes(candidates: list[tuple[Shape, dict]], sweep: ml_collections.ConfigDict, n_opt: float) -> list:
    """The ladder entries best matching targets log-evenly spaced over size_span around n_opt.

    An order-preserving assignment of the k targets to k distinct ladder entries (sorted by N) with
    the least squared error in log N (dynamic programming), so a coarse ladder gives the k entries
    nearest the optimum rather than piling up on one side.
    """
    order = sorted(range(len(candidates)), key=lambda i: _size(candidates[i][1], sweep))
    x = np.log([_size(candidates[i][1], sweep) for i in order])
    k, m = sweep.sizes_per_budget, len(order)
    if m < k:
        raise ConfigError(f"sweep.d_models has {m} shapes but sweep.sizes_per_budget={k}; add d_models")
    t = math.log(n_opt) + np.linspace(-0.5, 0.5, k) * math.log(sweep.size_span)
    cost = np.full((k, m), np.inf)  # cost[j, i]: targets 0..j matched, target j to ladder entry i
    back = np.zeros((k, m), dtype=int)
    cost[0] = (x - t[0]) ** 2
    for j in range(1, k):
        for i in range(j, m):
            best = int(np.argmin(cost[j - 1, :i]))
            cost[j, i], back[j, i] = cost[j - 1, best] + (x[i] - t[j]) ** 2, best
    picked = [int(np.argmin(cost[k - 1]))]
    for j in range(k - 1, 0, -1):
        picked.append(back[j, picked[-1]])
    return [candidates[order[i]] for i in reversed(picked)]


def _batch_size(base: ml_collections.ConfigDict, sweep: ml_collections.ConfigDict, budget: float, smallest: float) -> int:
    b = base.train.batch_size
    if sweep.batch_size_exponent == 0:
        return b
    scaled = b * (budget / smallest) ** sweep.batch_size_exponent
    return max(sweep.batch_multiple, int(round(scaled / sweep.batch_multiple)) * sweep.batch_multiple)


def isoflop_runs(config: ml_collections.ConfigDict) -> tuple[list[Run], list[str]]:
    """(runs, notes): every budget's sizes, steps, learning rates; notes say which sizes were dropped."""
    s, base = config.sweep, config.base
    vocab, seq = vocab_size(base), base.data.seq_len
    ladder = []
    for d in sorted(set(s.d_models)):
        shape = shape_for(s, d)
        ladder.append((shape, measure(run_config(base, s, shape, vocab), vocab)))
    lr_of = lr_rule(s)
    runs: list[Run] = []
    notes: list[str] = []
    for budget in sorted(s.budgets):
        n_opt = prior_optimum(s, budget)
        batch = _batch_size(base, s, budget, min(s.budgets))
        tokens_per_step = batch * seq
        picked = _pick_sizes(ladder, s, n_opt)
        shape0, m0 = picked[0]
        steps0 = round(budget / (m0["flops_per_token"] * tokens_per_step))
        if steps0 < s.min_steps:
            need = s.min_steps * tokens_per_step * m0["flops_per_token"]
            raise ConfigError(
                f"sweep.budgets: budget {format_flops(budget)} is too small for its smallest model {shape0.name} "
                f"(N={_size(m0, s):,}): {steps0} steps of {tokens_per_step} tokens < sweep.min_steps={s.min_steps}; "
                f"the smallest budget that works is {format_flops(need)} FLOPs (or lower batch_size/seq_len)")
        kept = []
        for shape, m in picked:
            steps = round(budget / (m["flops_per_token"] * tokens_per_step))
            if steps < s.min_steps:
                notes.append(f"budget {format_flops(budget)}: dropped {shape.name} (N={_size(m, s):,}), "
                             f"only {steps} steps < sweep.min_steps={s.min_steps}")
            else:
                kept.append((shape, m, steps))
        sizes = [_size(m, s) for _, m, _ in kept]
        if len(kept) < s.min_sizes:
            raise ConfigError(
                f"sweep.budgets: budget {format_flops(budget)} has only {len(kept)} sizes "
                f"({', '.join(sh.name for sh, _, _ in kept)}) with at least sweep.min_steps={s.min_steps} steps; "
                f"an IsoFLOP curve needs sweep.min_sizes={s.min_sizes}: raise the budget or add smaller d_models")
        if not sizes[0] < n_opt < sizes[-1]:
            raise ConfigError(
                f"sweep.budgets: budget {format_flops(budget)}'s sizes (N {sizes[0]:,}..{sizes[-1]:,}) do not "
                f"straddle its prior optimum N_opt={n_opt:,.0f}; the ladder sweep.d_models spans N "
                f"{_size(ladder[0][1], s):,}..{_size(ladder[-1][1], s):,}: extend it or change the budget")
        for shape, m, steps in kept:
            size = _size(m, s)
            lr = lr_of(size)
            cfg = run_config(base, s, shape, vocab, steps, lr, batch)
            rid = run_id(f"{shape.name}-C{format_flops(budget)}", cfg)
            runs.append(Run(rid, len(runs), shape, float(budget), int(m["params"]), int(m["params_non_embedding"]),
                            size, m["flops_per_token"], steps, batch, seq, lr, cfg.train.warmup_steps, cfg))
    return runs, notes


def lr_scan_runs(config: ml_collections.ConfigDict) -> tuple[list[Run], list[str]]:
    """(runs, notes): every lr_scan size at every learning rate of the log grid, on a fixed token count."""
    s, base = config.sweep, config.base
    scan = s.lr_scan
    vocab, seq, batch = vocab_size(base), base.data.seq_len, base.train.batch_size
    lrs = np.geomspace(scan.lr_min, scan.lr_max, scan.num_lrs)
    runs: list[Run] = []
    for d in sorted(set(scan.d_models)):
        shape = shape_for(s, d)
        m = measure(run_config(base, s, shape, vocab), vocab)
        size = _size(m, s)
        tokens = scan.tokens or scan.tokens_per_param * size
        steps = round(tokens / (batch * seq))
        if steps < s.min_steps:
            raise ConfigError(f"sweep.lr_scan: {shape.name} (N={size:,}) gets only {steps} steps < "
                              f"sweep.min_steps={s.min_steps}; raise sweep.lr_scan.tokens_per_param or tokens")
        for lr in lrs:
            lr = float(f"{lr:.4g}")
            cfg = run_config(base, s, shape, vocab, steps, lr, batch)
            rid = run_id(f"{shape.name}-lr{lr:.3g}", cfg)
            runs.append(Run(rid, len(runs), shape, None, int(m["params"]), int(m["params_non_embedding"]), size,
                            m["flops_per_token"], steps, batch, seq, lr, cfg.train.warmup_steps, cfg))
    return runs, []


def design(config: ml_collections.ConfigDict) -> tuple[list[Run], list[str]]:
    """Validates the sweep config and expands it into its runs (and notes on dropped sizes)."""
    validate_sweep(config)
    runs, notes = isoflop_runs(config) if config.sweep.mode == "isoflop" else lr_scan_runs(config)
    for r in runs:  # the training loop's own checks, before anything is trained
        validate.model_config(r.config, r.config.model.vocab_size)
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):
        raise ConfigError("two runs of the sweep have the same config; check sweep.d_models for duplicates")
    return runs, notes


def estimate_seconds(runs: list[Run], sweep: ml_collections.ConfigDict) -> float:
    """The dry run's time estimate (see sweep.estimate_* in transformer/sweeps/defaults.py)."""
    total = 0.0
    for r in runs:
        step = r.batch_size * r.seq_len * r.flops_per_token / sweep.estimate_flops_per_second
        total += r.steps * (step + sweep.estimate_step_overhead_s) + sweep.estimate_run_overhead_s
    return total
