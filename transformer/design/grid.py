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

from transformer.design.defaults import MODES, PARAM_COUNTS, sweep_defaults
from transformer.spec import (SCHEDULES, ConfigError, MissingInputError, flops_per_token, model_defaults, model_spec,
                              param_counts)

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
    role: str = "grid"           # grid | lr (calibration) | check (schedule check) | validate (prediction check)
    stage: str = ""              # the stage that designed it (plan.py): "lr", "C1e12", "validate"
    seed: int = 0
    branch_from: str | None = None  # wsd: the run whose decay-start checkpoint this one continues from
    start_step: int = 0          # the step it starts training at (a branch's source decay start), for estimates

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
                "learning_rate": self.learning_rate, "warmup_steps": self.warmup_steps, "role": self.role,
                "stage": self.stage, "seed": self.seed, "branch_from": self.branch_from,
                "start_step": self.start_step, "schedule": self.config.train.schedule,
                **dataclasses.asdict(self.shape)}


def format_flops(c: float) -> str:
    """1e11 → "1e11", 2.5e17 → "2.5e17" (compact, for run ids and tables)."""
    mantissa, _, exponent = f"{c:.3g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def run_id(label: str, config: ml_collections.ConfigDict) -> str:
    """`label-<8 hex>`: sha1 of the canonical JSON of the config without its environment keys and without the
    model settings at ModelConfig's defaults, so a new model option (whose default keeps today's model) does
    not rename every existing run."""
    d = json.loads(json.dumps(config.to_dict()))
    defaults = json.loads(json.dumps(model_defaults()))
    d["model"] = {k: v for k, v in d.get("model", {}).items() if k not in defaults or v != defaults[k]}
    if d.get("train", {}).get("grad_accum_steps") == 1:  # the default (no accumulation) keeps the earlier ids
        d["train"].pop("grad_accum_steps")
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
                          "(see transformer/design/defaults.py)")
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
    if not isinstance(s.num_layers, int) or s.num_layers < 0:
        raise ConfigError(f"sweep.num_layers={s.num_layers!r} must be 0 (depth from aspect_ratio) or a positive integer")
    if s.mode == "isoflop":
        budgets = list(s.budgets)
        if not budgets or any(not (isinstance(c, (int, float)) and c > 0) for c in budgets):
            raise ConfigError(f"sweep.budgets={tuple(budgets)} must be a non-empty list of positive FLOP counts")
        if len(set(budgets)) != len(budgets):
            raise ConfigError(f"sweep.budgets={tuple(budgets)} has repeated budgets")
        _validate_stages(config)
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


def _validate_stages(config: ml_collections.ConfigDict) -> None:
    """The staged settings of an IsoFLOP sweep (plan.py): calibration, seeds, schedule check, branches, validation."""
    s = config.sweep
    budgets = list(s.budgets)
    mults = list(s.lr_calibration.multipliers)
    if s.lr_calibration.d_models:
        ratios = np.diff(np.log(sorted(mults))) if len(mults) > 1 else []
        if len(mults) < 3 or any(m <= 0 for m in mults) or not np.allclose(ratios, ratios[0]):
            raise ConfigError(f"sweep.lr_calibration.multipliers={tuple(mults)} must be 3 or more positive factors "
                              "evenly spaced in log (e.g. 0.5, 1, 2)")
        if s.lr_calibration.fit_exponent and len(set(s.lr_calibration.d_models)) < 2:
            raise ConfigError("sweep.lr_calibration.fit_exponent=True needs 2 or more lr_calibration.d_models")
    if not isinstance(s.seeds.extra, int) or s.seeds.extra < 0 or s.seeds.sizes < 1:
        raise ConfigError(f"sweep.seeds.extra={s.seeds.extra!r} must be an integer >= 0 and sweep.seeds.sizes "
                          f"({s.seeds.sizes!r}) >= 1")
    for c in list(s.seeds.budgets) + ([s.schedule_check.budget] if s.schedule_check.budget else []):
        if not any(math.isclose(c, b, rel_tol=1e-9) for b in budgets):
            raise ConfigError(f"sweep.seeds.budgets / sweep.schedule_check.budget: {c!r} is not one of "
                              f"sweep.budgets={tuple(budgets)}")
    if s.schedule_check.schedule not in SCHEDULES:
        raise ConfigError(f"sweep.schedule_check.schedule={s.schedule_check.schedule!r} is not valid; choose one "
                          f"of {', '.join(SCHEDULES)}")
    if s.branch and config.base.train.schedule != "wsd":
        raise ConfigError(f"sweep.branch=True continues runs from a decay start: it needs base.train.schedule='wsd' "
                          f"(got {config.base.train.schedule!r})")
    if s.validate_flops and not s.validate_flops > max(budgets):
        raise ConfigError(f"sweep.validate_flops={s.validate_flops!r} must exceed the largest budget "
                          f"({max(budgets):.3g}): the prediction is checked beyond the grid")


def vocab_size(base: ml_collections.ConfigDict) -> int:
    """The vocabulary the runs will have: model.vocab_size, else the tokenizer's (without training one)."""
    if base.model.vocab_size:
        return int(base.model.vocab_size)
    if base.data.tokenizer == "bytes":
        from transformer.data.tokenizers import ByteTokenizer
        return ByteTokenizer().vocab_size
    if base.data.tokenizer == "sentencepiece":
        return int(base.data.vocab_size)
    from transformer.data.tokenizers import get_tokenizer  # a tokenizer file: read it (errors name the path)
    return get_tokenizer(base.data).vocab_size


def shape_for(sweep: ml_collections.ConfigDict, d_model: int) -> Shape:
    """The ladder's rule: depth sweep.num_layers (or from the aspect ratio when 0), heads from the fixed
    head_dim, d_ff from the ratio."""
    if d_model % sweep.head_dim:
        raise ConfigError(f"d_model={d_model} is not a multiple of sweep.head_dim={sweep.head_dim}; "
                          f"use d_models that are multiples of {sweep.head_dim}")
    layers = sweep.num_layers or int(np.clip(round(d_model / sweep.aspect_ratio), sweep.min_layers, sweep.max_layers))
    d_ff = max(sweep.ffn_multiple, int(round(sweep.ffn_ratio * d_model / sweep.ffn_multiple)) * sweep.ffn_multiple)
    return Shape(d_model=d_model, num_layers=layers, num_heads=d_model // sweep.head_dim,
                 head_dim=sweep.head_dim, d_ff=d_ff)


def warmup_for(sweep: ml_collections.ConfigDict, steps: int, size: int, tokens_per_step: int) -> int:
    """Warm-up steps: sweep.warmup_tokens_per_param · N tokens when set (Porian et al. 2024 warm up for N
    tokens; it depends on N alone, so wsd runs of one size at several budgets share it and can branch), else
    warmup_fraction of the run; at least warmup_min, at most half the run."""
    if sweep.warmup_tokens_per_param > 0:
        warmup = math.ceil(sweep.warmup_tokens_per_param * size / tokens_per_step)
    else:
        warmup = round(sweep.warmup_fraction * steps)
    return min(max(sweep.warmup_min, warmup), steps // 2)


def run_config(base: ml_collections.ConfigDict, sweep: ml_collections.ConfigDict, shape: Shape, vocab: int,
               steps: int = 1, learning_rate: float = 1e-3, batch_size: int | None = None, size: int = 0,
               seed: int | None = None, schedule: str | None = None) -> ml_collections.ConfigDict:
    """`base` with the shape, steps, schedule, warm-up, seed and batch of one run filled in."""
    c = ml_collections.ConfigDict(base.to_dict())
    c.model.update(dict(d_model=shape.d_model, num_layers=shape.num_layers, num_heads=shape.num_heads,
                        num_kv_heads=0, head_dim=shape.head_dim, d_ff=shape.d_ff, vocab_size=vocab))
    if c.model.positional in ("learned", "sinusoidal"):
        c.model.max_len = c.data.seq_len  # no unused position-table rows inflating N
    batch = batch_size or c.train.batch_size
    warmup = warmup_for(sweep, steps, size, batch * c.data.seq_len)
    if sweep.get("micro_batch_size", 0):  # a grown batch that would not fit: accumulated (train.grad_accum_steps)
        c.train.grad_accum_steps = grad_accum_for(sweep, batch)
    c.train.update(dict(
        steps=steps, learning_rate=float(learning_rate), warmup_steps=warmup, batch_size=batch,
        seed=c.train.seed if seed is None else int(seed), schedule=schedule or c.train.schedule,
        eval_every=max(1, math.ceil(steps / sweep.evals_per_run)),
        checkpoint_every=max(1, math.ceil(steps / sweep.checkpoints_per_run)),
        log_every=max(1, steps // sweep.logs_per_run)))
    return c


def measure(config: ml_collections.ConfigDict, vocab: int) -> dict[str, float]:
    """params, params_non_embedding, flops_per_token (with attention) and flops_per_token_no_attention of a
    run config's model."""
    cfg = model_spec(config, vocab)  # the counts need no layer: registry names are checked by plan.design
    counts, fpt = param_counts(cfg), flops_per_token(cfg, config.data.seq_len)
    return {"params": counts["total"], "params_non_embedding": counts["non_embedding"],
            "flops_per_token": fpt["with_attention"], "flops_per_token_no_attention": fpt["six_n"]}


def size_of(m: dict[str, float], sweep: ml_collections.ConfigDict) -> int:
    return int(m["params"] if sweep.param_count == "total" else m["params_non_embedding"])


def prior_optimum(sweep: ml_collections.ConfigDict, budget: float) -> float:
    """N_opt = G · C^a; G = (6 · tokens_per_param)^-a unless sweep.prior_coefficient is set."""
    a = sweep.prior_exponent
    g = sweep.prior_coefficient or (6.0 * sweep.prior_tokens_per_param) ** -a
    return g * budget ** a


def lr_rule(sweep: ml_collections.ConfigDict, fitted: dict | None = None) -> Callable[[float], float]:
    """N → peak learning rate: c·N^k, capped at sweep.lr_max; (c, k) from `fitted` (the sweep's own LR
    calibration), else from the file sweep.lr_fit names, else sweep.lr_coefficient and sweep.lr_exponent."""
    c, k = sweep.lr_coefficient, sweep.lr_exponent
    if fitted is not None:
        c, k = float(fitted["coefficient"]), float(fitted["exponent"])
    elif sweep.lr_fit:
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


def pick_sizes(candidates: list[tuple[Shape, dict]], sweep: ml_collections.ConfigDict, n_opt: float) -> list:
    """The ladder entries best matching targets log-evenly spaced over size_span around n_opt.

    An order-preserving assignment of the k targets to k distinct ladder entries (sorted by N) with
    the least squared error in log N (dynamic programming), so a coarse ladder gives the k entries
    nearest the optimum rather than piling up on one side.
    """
    order = sorted(range(len(candidates)), key=lambda i: size_of(candidates[i][1], sweep))
    x = np.log([size_of(candidates[i][1], sweep) for i in order])
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


def batch_size_for(base: ml_collections.ConfigDict, sweep: ml_collections.ConfigDict, budget: float, smallest: float) -> int:
    b = base.train.batch_size
    if sweep.batch_size_exponent == 0:
        return b
    scaled = b * (budget / smallest) ** sweep.batch_size_exponent
    return max(sweep.batch_multiple, int(round(scaled / sweep.batch_multiple)) * sweep.batch_multiple)


def grad_accum_for(sweep: ml_collections.ConfigDict, batch: int) -> int:
    """train.grad_accum_steps for a run of `batch` rows: the fewest micro-batches (a divisor k of batch) of at
    most sweep.micro_batch_size rows each, the rows one forward and backward pass is known to hold."""
    limit = int(sweep.micro_batch_size)
    return next(k for k in range(1, batch + 1) if batch % k == 0 and batch // k <= limit)
