"""A sweep's time estimate: one definition, from one run to the whole sweep, for the dry run, the choice of budgets
under sweep.max_hours and the progress line's ETA.

  a run     steps · (FLOPs per step / R + t0) + compilation + the rest of a run (sweep.estimate_*: R the sustained
            FLOP/s, t0 the overhead per step): `estimate_seconds`, each run's `estimated_seconds` in sweep.json;
  a unit    a run, or a sweep.multirun group (one program: R runs' compute, one step overhead, one start-up):
            (seconds alone, seconds holding its device) by `unit_seconds`;
  a stage   its units packed on the workers that train it (`packed_seconds`): the longest of the devices' busy
            time, the workers' time and the longest unit;
  the sweep the stages one after another (a stage trains once the one before is recorded), `sweep_seconds`,
            plus the one-time set-up (`total_seconds`: what sweep.max_hours bounds).
How the stages pack is the caller's (a `Schedule`: the sweeps layer knows the GPUs, the runs' memory and
--parallel; the default is one run after another in one process), so this module stays pure arithmetic. The ETA
calibrates the same estimate on the runs that have finished (`expected_seconds`: a run's estimate as it trained,
its stage's packing included; the ratio of the measured to those). No JAX.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from transformer.design.grid import Run
from transformer.design.spec import SweepSpec

Listed = Mapping[str, Any]  # a run as sweep.json lists it (Run.describe(), estimated_seconds, config)
# a stage's runs → (its units of work, in training order; the workers that train them; the devices those share)
Pack = Callable[[Sequence[Listed]], tuple[list[list[Listed]], int, int]]


def one_process(runs: Sequence[Listed]) -> tuple[list[list[Listed]], int, int]:
    """The default packing: each run alone, one after another, in one process."""
    return [[r] for r in runs], 1, 1


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How a sweep's runs will train, for its estimate: `pack` (a Pack) and `how`, the words the estimate line and
    the sweep.max_hours refusal say it with."""
    pack: Pack = one_process
    how: str = "in one process"


ONE_PROCESS = Schedule()


def estimate_seconds(run: Run, sweep: SweepSpec) -> float:
    """The time estimate of one run (sweep.estimate_*: its steps, its overhead and its compilation); a branch
    trains from its start step."""
    step = run.batch_size * run.seq_len * run.flops_per_token / sweep.estimate_flops_per_second
    return ((run.steps - run.start_step) * (step + sweep.estimate_step_overhead_s) + sweep.estimate_run_overhead_s
            + sweep.estimate_compile_s)


def listed(run: Run, sweep: SweepSpec) -> dict[str, Any]:
    """`run` as sweep.json lists it: its design numbers, its estimated_seconds and its config."""
    return {**run.describe(), "estimated_seconds": estimate_seconds(run, sweep), "config": run.config}


def device_seconds(run: Listed, sweep: Mapping[str, Any]) -> float:
    """The part of a run's estimate during which it holds its device, when other workers share it: each step's
    compute and the share of its overhead the others' steps cannot fill (1 − sweep.estimate_pack_overlap); not its
    start-up. `run` as sweep.json lists it, `sweep` its settings (SweepSpec.settings())."""
    step = run["batch_size"] * run["seq_len"] * run["flops_per_token"] / sweep["estimate_flops_per_second"]
    overhead = (1.0 - sweep.get("estimate_pack_overlap", 0.0)) * sweep["estimate_step_overhead_s"]
    return (run["steps"] - (run.get("start_step") or 0)) * (step + overhead)


def unit_seconds(runs: Sequence[Listed], sweep: Mapping[str, Any]) -> tuple[float, float]:
    """(seconds trained by itself, device seconds) of one unit of work: a run (its `estimated_seconds`), or a
    sweep.multirun group of R runs of one shape, one program whose steps cost R runs' compute but one step's
    overhead and one start-up: n·(R·c + s) + o."""
    alone = sum(float(r["estimated_seconds"]) for r in runs)
    device = sum(device_seconds(r, sweep) for r in runs)
    if len(runs) > 1:
        n = runs[0]["steps"] - (runs[0].get("start_step") or 0)
        s, extra = sweep["estimate_step_overhead_s"], len(runs) - 1
        alone -= extra * (n * s + sweep["estimate_run_overhead_s"])
        device -= extra * n * (1.0 - sweep.get("estimate_pack_overlap", 0.0)) * s
    return alone, device


def packed_seconds(units: Sequence[tuple[float, float]], workers: int, devices: int) -> float:
    """The estimated wall time of units of work, each (alone, device) seconds (unit_seconds), trained by `workers`
    workers sharing `devices` devices: the longest of the devices' busy time (Σ device / devices), the workers'
    time (Σ alone / workers: a worker's start-up and its steps' overhead overlap the others' work) and the longest
    unit. One worker per device: Σ alone / devices, as one process each."""
    if not units:
        return 0.0
    return max(sum(d for _, d in units) / max(devices, 1), sum(a for a, _ in units) / max(workers, 1),
               max(a for a, _ in units))


def stages(runs: Sequence[Listed]) -> list[list[Listed]]:
    """`runs` by stage, the stages in the order of their first run (the order they train in)."""
    out: dict[str, list[Listed]] = {}
    for r in runs:
        out.setdefault(r.get("stage") or "", []).append(r)
    return list(out.values())


def _packed(units: list[list[Listed]], workers: int, devices: int, sweep: Mapping[str, Any],
            scale: float) -> tuple[list[tuple[float, float]], float, float]:
    """(each unit's (alone, device) seconds × scale, the stage's packed seconds, its stretch: how much longer each
    unit takes than alone because the workers wait for the device, (Σ device / devices) / (Σ alone / workers), at
    least 1). The device bound matters only where workers outnumber devices (a unit's device time never exceeds its
    time alone), so only there are the device seconds, which need the rates, computed."""
    if workers > devices:
        items = [tuple(scale * x for x in unit_seconds(u, sweep)) for u in units]
    else:
        items = [(scale * sum(float(r["estimated_seconds"]) for r in u), 0.0) for u in units]
    alone = sum(a for a, _ in items) / max(workers, 1)
    busy = sum(d for _, d in items) / max(devices, 1)
    return items, packed_seconds(items, workers, devices), max(busy / alone, 1.0) if alone > 0 else 1.0


def sweep_seconds(runs: Sequence[Listed], sweep: Mapping[str, Any], pack: Pack = one_process, *,
                  scale: float = 1.0, ran: Mapping[str, float] | None = None) -> float:
    """The estimated wall seconds of `runs` (as sweep.json lists them), stage after stage, each stage's units
    packed as `pack` packs them, without the one-time set-up. `scale`: the calibration of the estimates (the ETA's
    measured / expected over the finished runs; 1: the prior). `ran`: {run_id: seconds it has trained} of running
    runs, taken off their unit's time as its stage's packing stretches it."""
    ran = ran or {}
    total = 0.0
    for stage in stages(runs):
        units, workers, devices = pack(stage)
        items, full, stretch = _packed(units, workers, devices, sweep, scale)
        if not any(r["run_id"] in ran for u in units for r in u):
            total += full
            continue
        left = []
        for unit, (alone, device) in zip(units, items):
            done = max((ran.get(r["run_id"], 0.0) for r in unit), default=0.0) / stretch
            rest = max(alone - done, 0.0)
            left.append((rest, device * rest / alone if alone > 0 else 0.0))
        total += packed_seconds(left, workers, devices)
    return total


def expected_seconds(runs: Sequence[Listed], sweep: Mapping[str, Any], pack: Pack = one_process) -> dict[str, float]:
    """{run_id: the seconds the estimate expects the run's wall_seconds to be}: its unit's time alone, stretched as
    its stage's packing shares the device (sweep_seconds' stretch; 1 in one process), a group's shared by its R runs
    as their summaries share its time (each the group's / R). `runs`: every run of the stages concerned (a stage
    packs all of its runs). The ETA's calibration: Σ measured / Σ expected."""
    out: dict[str, float] = {}
    for stage in stages(runs):
        units, workers, devices = pack(stage)
        items, _, stretch = _packed(units, workers, devices, sweep, 1.0)
        for unit, (alone, _) in zip(units, items):
            out.update({r["run_id"]: alone * stretch / len(unit) for r in unit})
    return out


def total_seconds(runs: Sequence[Run], sweep: SweepSpec, schedule: Schedule = ONE_PROCESS) -> float:
    """The estimated seconds of a sweep of `runs`, stage after stage as `schedule` packs them (default one after
    another in one process), its one-time set-up (sweep.estimate_setup_s) included: what sweep.max_hours bounds."""
    return sweep_seconds([listed(r, sweep) for r in runs], sweep.settings(), schedule.pack) + sweep.estimate_setup_s
