"""A sweep's settings as one frozen, checked spec: every `sweep.*` key with its default (the one source of them),
and the checks of their values, all in the constructors.

`SweepSpec.of(config)` reads a sweep config (a ConfigDict from configs/sweeps/, or a plain mapping with the same
`sweep` and `base` sections) once; the design (grid.py, plan.py, budgets.py) and the runner read the spec, and
`base` (a full training config) is carried as a plain nested dict. Standard library only: no ml_collections.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from transformer.design.sections import SECTIONS, LrCalibration, LrScan, ScheduleCheck, Seeds, Slurm
from transformer.spec import ConfigError
from transformer.spec.metric_keys import recorded_metrics

MODES = ("isoflop", "lr_scan")
PARAM_COUNTS = ("total", "non_embedding")


def plain(value: Any) -> Any:
    """A ConfigDict, mapping or sequence as JSON-shaped plain values (dicts, lists), as sweep.json stores them."""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    return json.loads(json.dumps(value, default=lambda v: list(v) if isinstance(v, (set, tuple)) else str(v)))


_POSITIVE_INTS = ("head_dim", "min_layers", "max_layers", "sizes_per_budget", "min_steps", "min_sizes",
                  "batch_multiple", "evals_per_run", "checkpoints_per_run", "logs_per_run", "num_budgets")


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """Every key a sweep config's `sweep` section may have, with its default (anything else is a ConfigError);
    `base`: the sweep's full training config (configs/lm.py) as a plain nested dict."""

    name: str = "sweep"
    mode: str = "isoflop"              # isoflop | lr_scan
    # Compute budgets C in FLOPs (tokens × flops_per_token with attention). Empty: the sweep chooses them
    # (design/budgets.py): num_budgets budgets budget_ratio apart, the smallest at which every budget's sizes
    # straddle the prior optimum with at least min_steps steps, checked against max_hours.
    budgets: tuple[float, ...] = ()
    num_budgets: int = 3
    budget_ratio: float = 2.0
    max_hours: float = 0.0             # > 0: the designed sweep's estimated time must fit (sweep.estimate_*)

    # The shape ladder: one model per d_model; num_layers = clip(round(d_model / aspect_ratio)),
    # num_heads = d_model / head_dim, d_ff = ffn_ratio · d_model rounded to a multiple of ffn_multiple.
    d_models: tuple[int, ...] = (32, 48, 64, 96, 128)
    num_layers: int = 0                # > 0: every shape has this depth and only the width varies; 0: aspect_ratio
    aspect_ratio: float = 32.0         # d_model / num_layers
    min_layers: int = 1
    max_layers: int = 64
    head_dim: int = 32
    ffn_ratio: float = 4.0
    ffn_multiple: int = 8

    # Which sizes each budget gets: around the prior optimum N_opt = G · C^a, evenly spaced in log N.
    param_count: str = "total"         # total | non_embedding: the N of the prior, spacing, LR rule and fits
    min_non_embedding_fraction: float = 0.0  # > 0: every run's non-embedding parameters (spec/accounting: all but
                                       # the token/position embeddings; an untied head counts as non-embedding)
                                       # are at least this share of its total N: narrower ladder shapes are left
                                       # out (a note), a size a setting names explicitly is a ConfigError
    allow_embedding_dominated: bool = False  # a NEW sweep whose grid runs have, at the median, most of their
                                       # parameters in the embeddings (share outside < 0.5, grid.EMBEDDING_FLOOR)
                                       # is refused unless this is True or min_non_embedding_fraction is set;
                                       # fewer such runs are a note (grid.embedding_dominated)
    sizes_per_budget: int = 4
    size_span: float = 10.0            # largest / smallest N within a budget
    prior_exponent: float = 0.5        # a in N_opt = G · C^a
    prior_tokens_per_param: float = 20.0  # G = (6 · tokens_per_param)^-a when prior_coefficient is 0
    prior_coefficient: float = 0.0
    recenter: bool = False             # centre each budget on the power law through the finished budgets' minima
    grid_from: str = ""                # DIR of a baseline IsoFLOP sweep: each budget trains that sweep's grid sizes
    min_steps: int = 20                # a run with fewer steps is dropped (or the budget is an error)
    min_sizes: int = 3                 # a budget with fewer sizes left is an error

    # Per-run rules.
    lr_coefficient: float = 0.05       # peak learning rate = lr_coefficient · N^lr_exponent ...
    lr_exponent: float = -0.25
    lr_max: float = 1e-2               # ... capped here
    lr_fit: str = ""                   # a DIR/lr_fit.json from an LR scan replaces the two numbers above
    warmup_fraction: float = 0.05      # warm-up = max(warmup_min, warmup_fraction · steps), at most steps / 2
    warmup_min: int = 10
    warmup_tokens_per_param: float = 0.0  # > 0: warm-up = this · N tokens instead (Porian et al. 2024: 1)
    branch: bool = False               # base.train.schedule=wsd: a size's run continues from the decay start of its
                                       # run at the previous budget (Hägele et al. 2024)
    batch_size_exponent: float = 0.0   # batch = base batch · (C / smallest budget)^exponent ...
    batch_multiple: int = 8            # ... rounded to a multiple of this (0 exponent: the base batch)
    micro_batch_size: int = 0          # > 0: a run's batch above this many rows is accumulated in micro-batches
                                       # of at most this many (train.grad_accum_steps; grid.grad_accum_for)
    validate_flops: float = 0.0        # > 0: after the grid, predict the compute-optimal model and its loss at this
                                       # budget (DIR/fit/predictions.json), train it, DIR/fit/validation.json
    validate_ratio: float = 0.0        # > 1 and validate_flops 0: validate at this × the largest budget (chosen budgets)
    predict_metrics: str = ""          # comma-separated metrics the runs record (metric_keys.recorded_metrics: a task's or a named
                                       # set's bits per byte) predicted beside the loss before the validation run
                                       # trains, and checked against it (DIR/fit/predictions.json, validation.json)

    lr_calibration: LrCalibration = LrCalibration()
    seeds: Seeds = Seeds()
    schedule_check: ScheduleCheck = ScheduleCheck()

    evals_per_run: int = 1             # evaluations spread over each run (the last one at its end)
    checkpoints_per_run: int = 4       # checkpoints spread over each run (resume granularity)
    logs_per_run: int = 10
    fit_bootstrap: int = 200           # bootstrap resamples for the fit's 95% intervals at the end of the sweep
    max_retries: int = 1               # a run that raises is retried (resuming) this many times, then recorded failed
    claim_timeout_s: float = 600.0     # a run claim not refreshed for this long (its runner died) may be taken over
    multirun: bool = False             # runs that differ only in learning rate or seed as one vmapped program
                                       # (each group one unit of work; no SLURM; slower on the 2-core CPU)
    workers_per_device: int = 0        # --parallel=0 on GPUs: worker processes sharing each GPU; 0: as many as the
                                       # runs' memory estimates allow (transformer/sweeps/packing.py)

    # Time estimate (the dry run, the chosen budgets, the ETA; design/estimate.py): per run, steps × (tokens_per_step
    # · flops_per_token / estimate_flops_per_second + estimate_step_overhead_s) + estimate_run_overhead_s +
    # estimate_compile_s; each stage's runs packed as the sweep will train them, the stages summed, and
    # estimate_setup_s once (max_hours bounds that).
    estimate_flops_per_second: float = 2.5e10
    estimate_step_overhead_s: float = 0.004
    estimate_run_overhead_s: float = 8.0
    estimate_compile_s: float = 0.0    # compilation per run (its train step, whose schedule is compiled in, and
                                       # its eval step); 0: counted in estimate_run_overhead_s
    estimate_setup_s: float = 0.0      # once per sweep: JAX start-up, the tokenizer and token cache, the fits
    estimate_source: str = ""          # where the rates above come from (device, date), printed with the estimate
    # Several workers on one device (--parallel; docs/sweeps.md "Several runs on one GPU"): the share of the step
    # overhead that the other workers' steps fill, 0 (none: the device time of a step is all of it) to 1; and the
    # device memory a dry run with --parallel=0 assumes where it sees no GPU, its estimate (and the max_hours
    # check) then packed as on that GPU (0: one run at a time).
    estimate_pack_overlap: float = 0.0
    estimate_device_memory_gb: float = 0.0

    lr_scan: LrScan = LrScan()
    slurm: Slurm = Slurm()
    base: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("budgets", "d_models"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "predict_metrics", _metric_list(self.predict_metrics))
        if self.mode not in MODES:
            raise ConfigError(f"sweep.mode={self.mode!r} is not valid; choose one of {', '.join(MODES)}")
        if self.param_count not in PARAM_COUNTS:
            raise ConfigError(f"sweep.param_count={self.param_count!r} is not valid; choose one of "
                              f"{', '.join(PARAM_COUNTS)}")
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"sweep.{name}={value!r} must be a positive integer")
        if self.min_sizes < 3:
            raise ConfigError(f"sweep.min_sizes={self.min_sizes} must be at least 3 (a parabola needs three points)")
        if self.sizes_per_budget < self.min_sizes:
            raise ConfigError(f"sweep.sizes_per_budget={self.sizes_per_budget} is below sweep.min_sizes="
                              f"{self.min_sizes}: each IsoFLOP curve needs at least {self.min_sizes} sizes")
        if not self.size_span > 1:
            raise ConfigError(f"sweep.size_span={self.size_span!r} must be > 1 (largest / smallest N in a budget)")
        if not 0 <= self.warmup_fraction < 1:
            raise ConfigError(f"sweep.warmup_fraction={self.warmup_fraction!r} must be in [0, 1)")
        if not isinstance(self.num_layers, int) or self.num_layers < 0:
            raise ConfigError(f"sweep.num_layers={self.num_layers!r} must be 0 (depth from aspect_ratio) or a "
                              "positive integer")
        if self.max_hours < 0:
            raise ConfigError(f"sweep.max_hours={self.max_hours!r} must be >= 0 (0: no time limit)")
        if isinstance(self.min_non_embedding_fraction, bool) or not 0 <= self.min_non_embedding_fraction < 1:
            raise ConfigError(f"sweep.min_non_embedding_fraction={self.min_non_embedding_fraction!r} must be in "
                              "[0, 1) (0: no floor; 0.5: non-embedding parameters at least half of N)")
        for name in ("estimate_compile_s", "estimate_setup_s"):
            if isinstance(getattr(self, name), bool) or not 0 <= getattr(self, name) < math.inf:
                raise ConfigError(f"sweep.{name}={getattr(self, name)!r} must be a number of seconds >= 0")
        if not isinstance(self.micro_batch_size, int) or isinstance(self.micro_batch_size, bool) \
                or self.micro_batch_size < 0:
            raise ConfigError(f"sweep.micro_batch_size={self.micro_batch_size!r} must be 0 (no accumulation) or a "
                              "positive number of rows")
        if not isinstance(self.workers_per_device, int) or isinstance(self.workers_per_device, bool) \
                or self.workers_per_device < 0:
            raise ConfigError(f"sweep.workers_per_device={self.workers_per_device!r} must be 0 (as many as fit) or a "
                              "positive number of workers per GPU")
        if not 0 <= self.estimate_pack_overlap <= 1:
            raise ConfigError(f"sweep.estimate_pack_overlap={self.estimate_pack_overlap!r} must be in [0, 1] (the "
                              "share of a step's overhead that other workers' steps fill)")
        if not self.estimate_device_memory_gb >= 0:
            raise ConfigError(f"sweep.estimate_device_memory_gb={self.estimate_device_memory_gb!r} must be >= 0 "
                              "(0: no packed estimate without a GPU)")
        if self.mode == "isoflop":
            self._check_isoflop()
        else:
            self._check_lr_scan()

    def _check_isoflop(self) -> None:
        for name in ("lr_coefficient", "lr_max"):  # the learning-rate rule, checked here: a run's
            value = getattr(self, name)            # train.learning_rate would name another setting
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigError(f"sweep.{name}={value!r} must be positive and finite (peak learning rate = "
                                  f"min(sweep.lr_max, sweep.lr_coefficient · N^sweep.lr_exponent))")
        if isinstance(self.lr_exponent, bool) or not isinstance(self.lr_exponent, (int, float)) \
                or not math.isfinite(self.lr_exponent):
            raise ConfigError(f"sweep.lr_exponent={self.lr_exponent!r} must be a finite number")
        budgets = list(self.budgets)
        if any(not (isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0) for c in budgets):
            raise ConfigError(f"sweep.budgets={tuple(budgets)} must be positive FLOP counts (or empty: the sweep "
                              "chooses them)")
        if len(set(budgets)) != len(budgets):
            raise ConfigError(f"sweep.budgets={tuple(budgets)} has repeated budgets")
        if not self.budget_ratio > 1:
            raise ConfigError(f"sweep.budget_ratio={self.budget_ratio!r} must be > 1 (the factor between chosen "
                              "budgets)")
        if self.validate_ratio and not self.validate_ratio > 1:
            raise ConfigError(f"sweep.validate_ratio={self.validate_ratio!r} must be > 1: the prediction is "
                              "checked beyond the grid")
        named = list(self.seeds.budgets) + ([self.schedule_check.budget] if self.schedule_check.budget else [])
        if named and not budgets:
            raise ConfigError("sweep.seeds.budgets / sweep.schedule_check.budget name budgets, but sweep.budgets "
                              "is empty (the sweep chooses them): set sweep.budgets, or leave those at their default")
        for c in named:
            if not any(math.isclose(c, b, rel_tol=1e-9) for b in budgets):
                raise ConfigError(f"sweep.seeds.budgets / sweep.schedule_check.budget: {c!r} is not one of "
                                  f"sweep.budgets={tuple(budgets)}")
        schedule = self.base.get("train", {}).get("schedule")
        if self.branch and schedule != "wsd":
            raise ConfigError(f"sweep.branch=True continues runs from a decay start: it needs "
                              f"base.train.schedule='wsd' (got {schedule!r})")
        if budgets and self.validate_flops and not self.validate_flops > max(budgets):
            raise ConfigError(f"sweep.validate_flops={self.validate_flops!r} must exceed the largest budget "
                              f"({max(budgets):.3g}): the prediction is checked beyond the grid")
        self._check_predict_metrics()

    def _check_predict_metrics(self) -> None:
        """Each of sweep.predict_metrics is a metric every run records (recorded_metrics), with a check to predict."""
        if not self.predict_metrics:
            return
        if not (self.validate_flops or self.validate_ratio):
            raise ConfigError(f"sweep.predict_metrics={self.predict_metrics!r} is predicted for the validation run: "
                              "set sweep.validate_flops (or sweep.validate_ratio) too")
        valid = recorded_metrics(self.base)
        for name in self.predict_metrics.split(","):
            if name not in valid:
                raise ConfigError(
                    f"sweep.predict_metrics: {name!r} is not a metric this sweep's runs record; valid: "
                    f"{', '.join(valid) or 'none'} (base.data.eval_sets and base.train.eval_tasks name the sets and "
                    "tasks; eval_loss is always predicted; a task's accuracy is no power law of compute: "
                    "experiments.fit --accuracy_metric fits it, the two-step law)")

    def _check_lr_scan(self) -> None:
        scan = self.lr_scan
        if self.predict_metrics:
            raise ConfigError("sweep.predict_metrics is the prediction check of an IsoFLOP sweep (sweep.mode="
                              "'isoflop' with sweep.validate_flops); an LR scan predicts nothing")
        if scan.num_lrs < 3:
            raise ConfigError(f"sweep.lr_scan.num_lrs={scan.num_lrs}: an LR scan needs at least 3 learning rates "
                              "per size (the optimum is a parabola through the best point and its neighbours)")
        if not 0 < scan.lr_min < scan.lr_max:
            raise ConfigError(f"sweep.lr_scan.lr_min={scan.lr_min!r} and lr_max={scan.lr_max!r} must satisfy "
                              "0 < lr_min < lr_max")
        if len(scan.d_models) < 2:
            raise ConfigError(f"sweep.lr_scan.d_models={tuple(scan.d_models)}: fitting lr_opt = c·N^k needs at "
                              "least 2 sizes")

    @property
    def staged(self) -> list[str]:
        """The settings that make later stages depend on earlier results."""
        return [k for k, on in (("lr_calibration", bool(self.lr_calibration.d_models)), ("recenter", self.recenter),
                                ("validate_flops", bool(self.validate_flops or self.validate_ratio))) if on]

    def settings(self) -> dict[str, Any]:
        """The `sweep` section as a plain dict (sweep.json's "sweep")."""
        d = dataclasses.asdict(self)
        d.pop("base")
        return plain(d)

    @classmethod
    def of(cls, config: Any) -> "SweepSpec":
        """The spec of a sweep config (ConfigDict or mapping with `sweep` and `base`), or `config` itself."""
        if isinstance(config, SweepSpec):
            return config
        if "sweep" not in config or "base" not in config:
            raise ConfigError("a sweep config needs a `sweep` section and a `base` training config "
                              "(see transformer/design/spec.py)")
        return cls.from_settings(plain(config["sweep"]), plain(config["base"]))

    @classmethod
    def from_settings(cls, sweep: Mapping[str, Any], base: Mapping[str, Any]) -> "SweepSpec":
        """From the `sweep` section's plain dict (unknown keys: ConfigError listing the valid ones)."""
        return cls(**_fields(cls, sweep, "sweep."), base=dict(base))


def _metric_list(value: Any) -> str:
    """sweep.predict_metrics as one comma-separated string without spaces or repeats (also from a list)."""
    items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if items is None or not all(isinstance(m, str) for m in items):
        raise ConfigError(f"sweep.predict_metrics={value!r} must be metric names, comma-separated, e.g. "
                          "'tasks/arc_easy/bits_per_byte,eval/wiki/bits_per_byte'")
    return ",".join(dict.fromkeys(m.strip() for m in items if m.strip()))


def _fields(cls: type, section: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """`section`'s keys checked against `cls`'s fields, nested sections built as their dataclasses."""
    if not isinstance(section, Mapping):
        raise ConfigError(f"{prefix.rstrip('.')} must be a section of settings, got {section!r}")
    names = [f.name for f in dataclasses.fields(cls) if f.name != "base"]
    unknown = sorted(set(section) - set(names))
    if unknown:
        raise ConfigError(f"unknown sweep setting(s) {', '.join(prefix + k for k in unknown)}; valid: "
                          f"{', '.join(prefix + k for k in sorted(names))}")
    out = {}
    for k, v in section.items():
        sub = SECTIONS.get(k) if prefix == "sweep." else None
        if sub is not None:
            out[k] = sub(**{n: tuple(x) if isinstance(x, list) else x for n, x in _fields(sub, v, f"{prefix}{k}.").items()})
        else:
            out[k] = tuple(v) if isinstance(v, list) else v
    return out


def sweep_defaults() -> dict[str, Any]:
    """Every key a `sweep` section may have, with its default, as a plain dict (configs/sweeps/common.py wraps it
    in a ConfigDict)."""
    d = dataclasses.asdict(SweepSpec())
    d.pop("base")
    return d


# How a sweep is run and what it estimates, not which runs it designs: these may differ when a sweep's DIR is run
# again (DIR/sweep.json is then rewritten with the new values, which its workers read). Every other sweep.* key is
# the sweep's design, recorded in DIR/sweep.json: a rerun with another value is refused (design_changes). The
# estimates and max_hours change the design only where the sweep chooses its budgets, and then the chosen
# (recorded) sweep.budgets or sweep.sizes_per_budget differ, which is refused.
RERUN_SETTINGS = ("max_retries", "claim_timeout_s", "multirun", "workers_per_device", "max_hours",
                  "allow_embedding_dominated",
                  "estimate_flops_per_second", "estimate_step_overhead_s", "estimate_run_overhead_s",
                  "estimate_compile_s", "estimate_setup_s", "estimate_source", "estimate_pack_overlap",
                  "estimate_device_memory_gb", "slurm")


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def design_changes(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The design settings (sweep.* outside RERUN_SETTINGS) whose values differ between a sweep.json's resolved
    `sweep` section (`recorded`; a key it lacks had its default when it was written) and the resolved settings
    `now` (SweepSpec.settings()), each as "sweep.KEY (recorded X, now Y)"; keys no longer known are ignored."""
    defaults = _flat(plain(sweep_defaults()))
    old, new = {**defaults, **_flat(plain(recorded))}, {**defaults, **_flat(plain(now))}
    rerun = lambda key: any(key == r or key.startswith(r + ".") for r in RERUN_SETTINGS)
    return [f"sweep.{k} (recorded {old[k]!r}, now {new[k]!r})" for k in sorted(defaults)
            if not rerun(k) and old.get(k) != new.get(k)]
