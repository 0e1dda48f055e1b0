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

import numpy as np

from transformer.design.spec import SweepSpec, plain
from transformer.spec import (ADDED_TRAIN_KEYS, ConfigError, DataSpec, MissingInputError, flops_per_token,
                              model_defaults, model_spec, param_counts)

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
    config: dict                 # the run's full training config (plain nested dict, as in sweep.json)
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
                "start_step": self.start_step, "schedule": self.config["train"]["schedule"],
                **dataclasses.asdict(self.shape)}


def format_flops(c: float) -> str:
    """1e11 → "1e11", 2.5e17 → "2.5e17" (compact, for run ids and tables)."""
    mantissa, _, exponent = f"{c:.3g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def run_id(label: str, config: Any) -> str:
    """`label-<8 hex>`: sha1 of the canonical JSON of the config without its environment keys and without the
    model settings at ModelConfig's defaults, so a new model option (whose default keeps today's model) does
    not rename every existing run."""
    d = plain(config)
    defaults = json.loads(json.dumps(model_defaults()))
    d["model"] = {k: v for k, v in d.get("model", {}).items() if k not in defaults or v != defaults[k]}
    for key, earlier in ADDED_TRAIN_KEYS.items():  # a train key added later, at its earlier value: the earlier ids
        if key in d.get("train", {}) and d["train"][key] == earlier:
            d["train"].pop(key)
    for key in _ENVIRONMENT_KEYS:
        *parents, last = key.split(".")
        holder = d
        for p in parents:
            holder = holder.get(p, {})
        holder.pop(last, None)
    canonical = json.dumps(d, sort_keys=True, separators=(",", ":"))
    return f"{label}-{hashlib.sha1(canonical.encode()).hexdigest()[:8]}"


_VOCAB: dict[str, int] = {}  # vocab_size's answers by settings: a tokenizer file is read once per process


def vocab_size(base: dict) -> int:
    """The vocabulary the runs will have: model.vocab_size, else the tokenizer's (without training one)."""
    model, data = base["model"], base["data"]
    key = json.dumps([model.get("vocab_size"), data], sort_keys=True, default=str)
    if key not in _VOCAB:
        _VOCAB[key] = _vocab_size(model, data)
    return _VOCAB[key]


def _vocab_size(model: dict, data: dict) -> int:
    if model.get("vocab_size"):
        return int(model["vocab_size"])
    if data["tokenizer"] == "bytes":
        from transformer.data.tokenizers import ByteTokenizer
        return ByteTokenizer().vocab_size
    if data["tokenizer"] == "sentencepiece":
        return int(data["vocab_size"])
    from transformer.data.tokenizers import get_tokenizer  # a tokenizer file: read it (errors name the path)
    return get_tokenizer(DataSpec.of(data)).vocab_size


def shape_for(sweep: SweepSpec, d_model: int) -> Shape:
    """The ladder's rule: depth sweep.num_layers (or from the aspect ratio when 0), heads from the fixed
    head_dim, d_ff from the ratio."""
    if d_model % sweep.head_dim:
        raise ConfigError(f"d_model={d_model} is not a multiple of sweep.head_dim={sweep.head_dim}; "
                          f"use d_models that are multiples of {sweep.head_dim}")
    layers = sweep.num_layers or int(np.clip(round(d_model / sweep.aspect_ratio), sweep.min_layers, sweep.max_layers))
    d_ff = max(sweep.ffn_multiple, int(round(sweep.ffn_ratio * d_model / sweep.ffn_multiple)) * sweep.ffn_multiple)
    return Shape(d_model=d_model, num_layers=layers, num_heads=d_model // sweep.head_dim,
                 head_dim=sweep.head_dim, d_ff=d_ff)


def warmup_for(sweep: SweepSpec, steps: int, size: int, tokens_per_step: int) -> int:
    """Warm-up steps: sweep.warmup_tokens_per_param · N tokens when set (Porian et al. 2024 warm up for N
    tokens; it depends on N alone, so wsd runs of one size at several budgets share it and can branch), else
    warmup_fraction of the run; at least warmup_min, at most half the run."""
    if sweep.warmup_tokens_per_param > 0:
        warmup = math.ceil(sweep.warmup_tokens_per_param * size / tokens_per_step)
    else:
        warmup = round(sweep.warmup_fraction * steps)
    return min(max(sweep.warmup_min, warmup), steps // 2)


def run_config(base: dict, sweep: SweepSpec, shape: Shape, vocab: int, steps: int = 1, learning_rate: float = 1e-3,
               batch_size: int | None = None, size: int = 0, seed: int | None = None,
               schedule: str | None = None) -> dict:
    """A copy of `base` (plain nested dict) with the shape, steps, schedule, warm-up, seed and batch of one run."""
    c = plain(base)
    c["model"].update(d_model=shape.d_model, num_layers=shape.num_layers, num_heads=shape.num_heads,
                      num_kv_heads=0, head_dim=shape.head_dim, d_ff=shape.d_ff, vocab_size=vocab)
    seq_len, train = c["data"]["seq_len"], c["train"]
    if c["model"].get("positional") in ("learned", "sinusoidal"):
        c["model"]["max_len"] = seq_len  # no unused position-table rows inflating N
    batch = batch_size or train["batch_size"]
    warmup = warmup_for(sweep, steps, size, batch * seq_len)
    if sweep.micro_batch_size:  # a grown batch that would not fit: accumulated (train.grad_accum_steps)
        train["grad_accum_steps"] = grad_accum_for(sweep, batch)
    train.update(
        steps=steps, learning_rate=float(learning_rate), warmup_steps=warmup, batch_size=batch,
        seed=train["seed"] if seed is None else int(seed), schedule=schedule or train["schedule"],
        eval_every=max(1, math.ceil(steps / sweep.evals_per_run)),
        checkpoint_every=max(1, math.ceil(steps / sweep.checkpoints_per_run)),
        log_every=max(1, steps // sweep.logs_per_run))
    return c


def measure(config: dict, vocab: int) -> dict[str, float]:
    """params, params_non_embedding, flops_per_token (with attention) and flops_per_token_no_attention of a
    run config's model."""
    cfg = model_spec(config, vocab)  # the counts need no layer: registry names are checked by plan.design
    counts, fpt = param_counts(cfg), flops_per_token(cfg, config["data"]["seq_len"])
    return {"params": counts["total"], "params_non_embedding": counts["non_embedding"],
            "flops_per_token": fpt["with_attention"], "flops_per_token_no_attention": fpt["six_n"]}


def size_of(m: dict[str, float], sweep: SweepSpec) -> int:
    return int(m["params"] if sweep.param_count == "total" else m["params_non_embedding"])


def prior_optimum(sweep: SweepSpec, budget: float) -> float:
    """N_opt = G · C^a; G = (6 · tokens_per_param)^-a unless sweep.prior_coefficient is set."""
    a = sweep.prior_exponent
    g = sweep.prior_coefficient or (6.0 * sweep.prior_tokens_per_param) ** -a
    return g * budget ** a


def lr_rule(sweep: SweepSpec, fitted: dict | None = None) -> Callable[[float], float]:
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


def pick_sizes(candidates: list[tuple[Shape, dict]], sweep: SweepSpec, n_opt: float) -> list:
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


def batch_size_for(base: dict, sweep: SweepSpec, budget: float, smallest: float) -> int:
    b = base["train"]["batch_size"]
    if sweep.batch_size_exponent == 0:
        return b
    scaled = b * (budget / smallest) ** sweep.batch_size_exponent
    return max(sweep.batch_multiple, int(round(scaled / sweep.batch_multiple)) * sweep.batch_multiple)


def grad_accum_for(sweep: SweepSpec, batch: int) -> int:
    """train.grad_accum_steps for a run of `batch` rows: the fewest micro-batches (a divisor k of batch) of at
    most sweep.micro_batch_size rows each, the rows one forward and backward pass is known to hold."""
    limit = int(sweep.micro_batch_size)
    return next(k for k in range(1, batch + 1) if batch % k == 0 and batch // k <= limit)


def _measured(sweep: SweepSpec, d_models: Any) -> list[tuple[Shape, dict]]:
    vocab = vocab_size(sweep.base)
    out = []
    for d in sorted(set(sweep.d_models if d_models is None else d_models)):
        shape = shape_for(sweep, d)
        out.append((shape, measure(run_config(sweep.base, sweep, shape, vocab), vocab)))
    return out


def non_embedding_share(m: dict) -> float:
    """The share of a shape's parameters outside the embeddings (spec/accounting's non_embedding / total)."""
    return m["params_non_embedding"] / m["params"]


EMBEDDING_FLOOR = 0.5  # a run with less than this share of its parameters outside the embeddings measures them


def embedding_dominated(runs: list[dict], sweep: SweepSpec, *, new: bool = False) -> str | None:
    """The note on the grid runs (sweep documents' run dicts: params, params_non_embedding, d_model) most of whose
    parameters are embeddings (None: none). `new`: the sweep has no sweep.json yet — where the median grid run is
    such a run, and neither sweep.min_non_embedding_fraction nor sweep.allow_embedding_dominated is set, a
    ConfigError saying what to change (a sweep already recorded keeps the note: its runs are trained)."""
    grid_runs = [r for r in runs if r["role"] == "grid" and r.get("params_non_embedding")]
    low = {r["d_model"]: r["params_non_embedding"] / r["params"] for r in grid_runs
           if r["params_non_embedding"] / r["params"] < EMBEDDING_FLOOR}
    if not low:
        return None
    shares = sorted(r["params_non_embedding"] / r["params"] for r in grid_runs)
    median = shares[len(shares) // 2]
    named = ", ".join(f"d{d} {share:.0%}" for d, share in sorted(low.items()))
    what = (f"of {len(grid_runs)} grid runs, {sum(r['d_model'] in low for r in grid_runs)} keep less than "
            f"{EMBEDDING_FLOOR:.0%} of their parameters outside the embeddings ({named}; median run "
            f"{median:.0%}) with the {vocab_size(sweep.base):,}-entry vocabulary")
    if (new and median < EMBEDDING_FLOOR and not sweep.allow_embedding_dominated
            and not sweep.min_non_embedding_fraction):
        raise ConfigError(f"{what}: most runs would measure their embeddings, not the model; set "
                          f"sweep.min_non_embedding_fraction={EMBEDDING_FLOOR:g} (leaves the narrow shapes out), "
                          f"use wider d_models or more layers (sweep.num_layers), a smaller vocabulary or tied "
                          f"embeddings, or a GPU-sized sweep (configs/sweeps/gpu_quick.py); "
                          f"sweep.allow_embedding_dominated=True runs it anyway")
    return (f"{what}: their losses say more about the embeddings than about the model; the fit's non_embedding "
            f"convention (beside the headline) shows how much that moves the exponent")


def _floor_advice(sweep: SweepSpec) -> str:
    return (f"with the {vocab_size(sweep.base):,}-entry vocabulary; use wider d_models, more layers "
            f"(sweep.num_layers), a smaller vocabulary or tied embeddings, or lower sweep.min_non_embedding_fraction")


def ladder(sweep: SweepSpec, d_models: Any = None, setting: str = "") -> list[tuple[Shape, dict]]:
    """(shape, {params, params_non_embedding, flops_per_token}) for each d_model, in increasing width, without the
    shapes whose non-embedding share is below sweep.min_non_embedding_fraction (left_out's note names them).
    `setting`: the sweep setting that names these d_models one by one (e.g. "sweep.lr_calibration.d_models"):
    a shape below the floor is then a ConfigError. ConfigError too when no shape is left."""
    floor = sweep.min_non_embedding_fraction
    out = _measured(sweep, d_models)
    kept = [(shape, m) for shape, m in out if non_embedding_share(m) >= floor]
    if setting and len(kept) < len(out):
        shape, m = next((shape, m) for shape, m in out if non_embedding_share(m) < floor)
        raise ConfigError(f"{setting}: d_model {shape.d_model} ({shape.name}, N={m['params']:,}) has "
                          f"{non_embedding_share(m):.0%} of its parameters outside the embeddings, below "
                          f"sweep.min_non_embedding_fraction={floor:g} {_floor_advice(sweep)}")
    if out and not kept:
        shape, m = out[-1]
        raise ConfigError(f"sweep.min_non_embedding_fraction={floor:g}: no shape of sweep.d_models keeps "
                          f"{floor:.0%} of its parameters outside the embeddings (the widest, {shape.name}, has "
                          f"{non_embedding_share(m):.0%}) {_floor_advice(sweep)}")
    return kept


def left_out(sweep: SweepSpec) -> str | None:
    """The note naming the shapes of sweep.d_models that sweep.min_non_embedding_fraction leaves out (None: none)."""
    floor = sweep.min_non_embedding_fraction
    low = [(shape, m) for shape, m in _measured(sweep, None) if non_embedding_share(m) < floor] if floor else []
    if not low:
        return None
    return (f"sweep.min_non_embedding_fraction={floor:g}: d_models {', '.join(str(s.d_model) for s, _ in low)} left "
            f"out (non-embedding {', '.join(f'{non_embedding_share(m):.0%}' for _, m in low)} of N with the "
            f"{vocab_size(sweep.base):,}-entry vocabulary); every run keeps at least {floor:.0%}")


def make_run(sweep: SweepSpec, shape: Shape, m: dict, budget: float, lr: float, *, role: str, stage: str,
             seed: int | None = None, schedule: str | None = None, label: str = "") -> Run:
    """One run at `budget` FLOPs: steps = round(C / (flops_per_token · tokens per step))."""
    base = sweep.base
    seq_len = base["data"]["seq_len"]
    batch = batch_size_for(base, sweep, budget, min(sweep.budgets))
    steps = round(budget / (m["flops_per_token"] * batch * seq_len))
    size = size_of(m, sweep)
    cfg = run_config(base, sweep, shape, vocab_size(base), steps, lr, batch, size, seed, schedule)
    rid = run_id(label or f"{shape.name}-C{format_flops(budget)}", cfg)
    return Run(rid, 0, shape, float(budget), int(m["params"]), int(m["params_non_embedding"]), size,
               m["flops_per_token"], steps, batch, seq_len, float(lr), cfg["train"]["warmup_steps"], cfg,
               role=role, stage=stage, seed=cfg["train"]["seed"])


class BudgetError(ConfigError):
    """A budget the ladder cannot serve (too few sizes with sweep.min_steps steps, or sizes that do not straddle
    the prior optimum): the sweep's choice of budgets (budgets.py) tries the next one."""


def budget_sizes(sweep: SweepSpec, lad: list, budget: float, n_opt: float, how: str,
                 lr_of: Callable[[float], float]) -> tuple[list[tuple[Run, dict]], list[str]]:
    """(grid run, measures) of the ladder sizes picked around n_opt with at least sweep.min_steps steps, and notes
    on what was dropped; BudgetError when the budget cannot make an IsoFLOP curve (`how`: where n_opt is from)."""
    stage, notes, kept = f"C{format_flops(budget)}", [], []
    for i, (shape, m) in enumerate(pick_sizes(lad, sweep, n_opt)):
        run = make_run(sweep, shape, m, budget, lr_of(size_of(m, sweep)), role="grid", stage=stage)
        if i == 0 and run.steps < sweep.min_steps:
            need = sweep.min_steps * run.batch_size * run.seq_len * run.flops_per_token
            raise BudgetError(
                f"sweep.budgets: budget {format_flops(budget)} is too small for its smallest model {shape.name} "
                f"(N={run.size:,}): {run.steps} steps of {run.batch_size * run.seq_len} tokens < sweep.min_steps="
                f"{sweep.min_steps}; the smallest budget that works is {format_flops(need)} FLOPs (or lower "
                f"batch_size/seq_len)")
        if run.steps < sweep.min_steps:
            notes.append(f"budget {format_flops(budget)}: dropped {shape.name} (N={run.size:,}), only {run.steps} "
                         f"steps < sweep.min_steps={sweep.min_steps}")
        else:
            kept.append((run, m))
    if len(kept) < sweep.min_sizes:
        raise BudgetError(
            f"sweep.budgets: budget {format_flops(budget)} has only {len(kept)} sizes with at least "
            f"sweep.min_steps={sweep.min_steps} steps; an IsoFLOP curve needs sweep.min_sizes={sweep.min_sizes}: "
            f"raise the budget, lower sweep.min_steps or add smaller d_models")
    sizes = [r.size for r, _ in kept]
    if not sizes[0] < n_opt < sizes[-1]:
        message = (f"budget {format_flops(budget)}'s sizes (N {sizes[0]:,}..{sizes[-1]:,}) do not straddle its "
                   f"{how} optimum N_opt={n_opt:,.0f}; sweep.d_models spans N {size_of(lad[0][1], sweep):,}.."
                   f"{size_of(lad[-1][1], sweep):,}")
        if how == "prior":
            raise BudgetError(f"sweep.budgets: {message}: extend the ladder or change the budget")
        notes.append(f"{message}: extend sweep.d_models")
    return kept, notes
