"""The sub-sections of a sweep's settings (`sweep.lr_calibration`, `sweep.seeds`, `sweep.schedule_check`,
`sweep.lr_scan`, `sweep.slurm`): each a frozen dataclass whose fields are the keys with their defaults and whose
constructor checks their values. spec.SweepSpec holds one of each. Standard library only.
"""
from __future__ import annotations

import dataclasses
import math

from transformer.spec import SCHEDULES, ConfigError


@dataclasses.dataclass(frozen=True)
class LrCalibration:
    """The learning rate from measurement, a stage before the budgets: each size trains at the smallest budget's
    compute at the rule's rate × each multiplier (extended where a size's best rate is at an edge); lr_opt = c·N^k
    is refitted from the optima (k = lr_exponent held unless fit_exponent), and every later run uses it."""

    d_models: tuple[int, ...] = ()     # empty: no calibration
    multipliers: tuple[float, ...] = (0.5, 1.0, 2.0)
    max_extensions: int = 2
    fit_exponent: bool = False

    def __post_init__(self) -> None:
        mults = sorted(self.multipliers)
        if self.d_models:
            logs = [math.log(m) for m in mults if m > 0]
            ratios = [b - a for a, b in zip(logs, logs[1:])]
            if len(mults) < 3 or len(logs) < len(mults) or any(abs(r - ratios[0]) > 1e-6 for r in ratios):
                raise ConfigError(f"sweep.lr_calibration.multipliers={tuple(self.multipliers)} must be 3 or more "
                                  "positive factors evenly spaced in log (e.g. 0.5, 1, 2)")
            if self.fit_exponent and len(set(self.d_models)) < 2:
                raise ConfigError("sweep.lr_calibration.fit_exponent=True needs 2 or more lr_calibration.d_models")


@dataclasses.dataclass(frozen=True)
class Seeds:
    """Seed replicates: the `sizes` runs nearest the optimum of each budget in `budgets` (empty: the smallest)
    train again under `extra` more seeds; the fits take σ from their spread."""

    extra: int = 0
    budgets: tuple[float, ...] = ()
    sizes: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.extra, int) or self.extra < 0 or self.sizes < 1:
            raise ConfigError(f"sweep.seeds.extra={self.extra!r} must be an integer >= 0 and sweep.seeds.sizes "
                              f"({self.sizes!r}) >= 1")


@dataclasses.dataclass(frozen=True)
class ScheduleCheck:
    """The grid runs of one budget trained again under another schedule (e.g. wsd against cosine), reported in
    DIR/fit/schedule_check.json and not fitted."""

    budget: float = 0.0                # 0: off
    schedule: str = "cosine"
    sizes: int = 0                     # the sizes nearest the budget's centre that are checked; 0: all

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"sweep.schedule_check.schedule={self.schedule!r} is not valid; choose one of "
                              f"{', '.join(SCHEDULES)}")


@dataclasses.dataclass(frozen=True)
class LrScan:
    """mode lr_scan: each size trained at `num_lrs` peak learning rates log-spaced over [lr_min, lr_max], on
    tokens_per_param · N tokens (or a fixed `tokens` when nonzero)."""

    d_models: tuple[int, ...] = (32, 64, 96)
    lr_min: float = 1e-3
    lr_max: float = 3e-2
    num_lrs: int = 5
    tokens_per_param: float = 20.0
    tokens: int = 0


@dataclasses.dataclass(frozen=True)
class Slurm:
    """--launcher=slurm: a job array per stage, one task per run, and a driver job after it (docs/clusters.md)."""

    time: str = "auto"                 # per run: time_factor x the plan's estimate (at least 10 min); or "HH:MM:SS"
    time_factor: float = 3.0
    gpus_per_task: int = 1             # 0 on a CPU partition
    gpu_request: str = "gres"          # how GPUs are asked for: "gres" (--gres=gpu[:type]:N), "gpus", "gpus-per-task"
    gpu_type: str = ""                 # e.g. "a100", as `sinfo -o %G` names it
    cpus_per_task: int = 8
    mem: str = ""                      # e.g. "64G"; "" leaves it to the cluster
    partition: str = ""
    account: str = ""
    qos: str = ""
    constraint: str = ""
    exclude: str = ""                  # nodes, e.g. "node[01-03]"
    sbatch_options: str = ""           # more #SBATCH lines, space-separated: "--reservation=r1 --mail-type=END"
    max_parallel: int = 0              # array throttle (%K); 0: no limit
    setup: str = ""                    # shell lines run before the worker (module load, venv activation)
    signal: str = "USR1"               # sent signal_seconds before the time limit: checkpoint, then requeue
    signal_seconds: int = 120
    max_submits: int = 3               # submissions of a run that end without a result before it counts as failed
    driver_time: str = "01:00:00"      # the driver job's limit (it designs the next stage, predicts, fits)


SECTIONS = {  # the sub-section of each `sweep.<key>`
    "lr_calibration": LrCalibration, "seeds": Seeds, "schedule_check": ScheduleCheck, "lr_scan": LrScan,
    "slurm": Slurm}
