"""What a sweep prints: the dry run's table of runs (epochs, time estimate) and the runner's progress lines
(done/running/failed/diverged/total, what happened, an ETA)."""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Mapping, Sequence

from transformer.data import token_cache
from transformer.design import estimate
from transformer.design.grid import format_flops
from transformer.sweeps import packing
from transformer.spec import DataSpec


class Progress:
    """One line per event: done/running/failed/total, what happened, and an ETA for the whole sweep: the runs of
    the stages designed so far not yet finished (those running less the time they have run) plus `later`, the runs
    of the stages not designed yet (next_stage.later_runs: the priors' guess), by the one estimate the plan is
    checked with (design/estimate.py: per run steps·(FLOPs/R + t0) + compilation + the rest, stage after stage,
    each stage's units packed as `pack` packs them). Once runs of this sweep have finished ok, that estimate is
    calibrated on them: × Σ their wall_seconds / Σ what the estimate expected of them as they trained
    (estimate.expected_seconds; recorded before this command or finished in it), so a run's fixed costs stay fixed
    and its steps scale (before: seconds per trained FLOP, which counted the first run's compilation as if it grew
    with FLOPs: 22 min said for 5 left on the H100). The line says which: "prior: sweep.estimate_*" or
    "measured: K runs". `settings`: sweep.json's "sweep" (sweep.multirun's groups are units; the rates the device
    bound needs); `pack`: a stage's runs → (units, workers, devices) (runner.schedule: the runner's slots; default
    the units on `parallel` workers on `devices` devices, one device per worker when None). `clock`: seconds
    (time.time; a fake one in tests)."""

    def __init__(self, runs: Sequence[dict[str, Any]], recorded: dict[str, dict],
                 later: Sequence[dict[str, Any]] = (), parallel: int = 1, clock: Callable[[], float] = time.time,
                 settings: Mapping[str, Any] | None = None, devices: int | None = None,
                 pack: estimate.Pack | None = None):
        self.clock, self.settings, self._pack = clock, dict(settings or {}), pack
        self.workers(parallel, devices)
        self.measured: dict[str, float] = {}  # run_id -> wall seconds, ok runs
        self.started_at: dict[str, float] = {}
        self.stage(runs, recorded, later)

    def workers(self, parallel: int, devices: int | None = None) -> None:
        """`parallel` workers on `devices` devices (None: one each) train what is left (without a `pack`)."""
        self.parallel = max(int(parallel), 1)
        self.devices = max(int(devices), 1) if devices else self.parallel

    def pack(self, runs: Sequence[dict[str, Any]]) -> tuple[list[list[dict[str, Any]]], int, int]:
        """A stage's runs → (its units, workers, devices): `pack`'s, else its units on this Progress's workers."""
        if self._pack is not None:
            return self._pack(runs)
        key = unit_key(self.settings) if self.settings else (lambda r: None)
        return units_of(runs, key), self.parallel, self.devices

    def stage(self, runs: Sequence[dict[str, Any]], recorded: dict[str, dict],
              later: Sequence[dict[str, Any]] = ()) -> None:
        """The runs of the sweep designed so far (a new stage keeps what was measured)."""
        self.runs = {r["run_id"]: r for r in runs}
        self.status = {rid: row.get("status") for rid, row in recorded.items() if rid in self.runs}
        self.running: set[str] = set()
        self.later = list(later)
        for rid, row in recorded.items():
            if rid in self.runs:
                self._measure(self.runs[rid], row)

    def _measure(self, run: dict[str, Any], row: dict[str, Any]) -> None:
        wall = row.get("wall_seconds") or 0.0
        if row.get("status") == "ok" and wall > 0:
            self.measured[run["run_id"]] = float(wall)

    def calibration(self) -> float | None:
        """Σ measured / Σ expected seconds over this sweep's finished ok runs (None before one has finished): what
        the estimate is multiplied by."""
        done = [rid for rid in self.measured if rid in self.runs]
        if not done:
            return None
        expected = estimate.expected_seconds(list(self.runs.values()), self.settings, self.pack)
        total = sum(expected[rid] for rid in done)
        return sum(self.measured[rid] for rid in done) / total if total > 0 else None

    def eta(self) -> tuple[float, str]:
        """(seconds left for the whole sweep, what they are from: "measured: K runs" or "prior: sweep.estimate_*")."""
        scale, now = self.calibration(), self.clock()
        pending = [r for rid, r in self.runs.items() if rid not in self.status] + self.later
        ran = {rid: now - self.started_at[rid] for rid in self.running if rid in self.started_at}
        seconds = estimate.sweep_seconds(pending, self.settings, self.pack, scale=scale or 1.0, ran=ran)
        n = len([rid for rid in self.measured if rid in self.runs])
        return seconds, (f"measured: {n} run{'s' * (n != 1)}" if scale else "prior: sweep.estimate_*")

    def eta_seconds(self) -> float:
        return self.eta()[0]

    def _eta(self) -> str:
        seconds, basis = self.eta()
        if seconds <= 0:
            return f"0s ({basis})"
        return (f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m" if seconds >= 3600 else
                f"{int(seconds // 60)}m{int(seconds % 60):02d}s") + f" ({basis})"

    def event(self, message: str) -> None:
        done = sum(1 for s in self.status.values() if s == "ok")
        diverged = sum(1 for s in self.status.values() if s == "diverged")
        failed = len(self.status) - done - diverged
        print(f"[sweep {len(self.status)}/{len(self.runs)} done, {len(self.running)} running, {failed} failed, "
              + (f"{diverged} diverged, " if diverged else "") + f"ETA {self._eta()}] {message}", flush=True)

    def started(self, run: dict[str, Any]) -> None:
        self.running.add(run["run_id"])
        self.started_at[run["run_id"]] = self.clock()
        self.event(f"start {run['run_id']}: N={run['params']:,}, {run['steps']} steps, lr {run['learning_rate']:.3g}")

    def finished(self, run: dict[str, Any], row: dict[str, Any] | None, note: str = "") -> None:
        self.running.discard(run["run_id"])
        if row is None:
            self.event(f"stopped {run['run_id']} {note}".rstrip())
            return
        self.status[run["run_id"]] = row["status"]
        self._measure(run, row)
        if row["status"] == "ok":
            epochs = f", {row['epochs']:.2g} epochs" if row.get("epochs") is not None else ""
            self.event(f"done {run['run_id']}: eval_loss {row['eval_loss']:.4f} in {row['wall_seconds']:.0f}s{epochs}")
        else:  # "diverged" or "failed" (sweeps/execute.verdict)
            self.event(f"{row['status'].upper()} {run['run_id']}: {row['error']}")


def unit_key(settings: Mapping[str, Any]) -> Callable[[dict[str, Any]], Any]:
    """The key `units_of` gathers a sweep's pending runs by: with sweep.multirun training/grouping.group_key (runs
    that differ only in learning rate and seed train as one program), else none (one unit per run)."""
    from transformer.training.grouping import group_key

    return (lambda r: group_key(r["config"])) if settings.get("multirun") else (lambda r: None)


def units_of(runs: Sequence[dict[str, Any]], key: Callable[[dict[str, Any]], Any]) -> list[list[dict[str, Any]]]:
    """`runs` gathered into units of work, in the order of each unit's first run: runs with the same `key` (not None)
    together, each run whose key is None alone (sweep.multirun: key = training/grouping.group_key)."""
    out: dict[Any, list[dict[str, Any]]] = {}
    for i, r in enumerate(runs):
        k = key(r)
        out.setdefault(("run", i) if k is None else ("key", k), []).append(r)
    return list(out.values())


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def _train_split_tokens(data: dict, known: dict) -> int | None:
    """Tokens of the training split from the token cache's meta.json (None until the data is tokenized:
    a dry run builds, trains and writes nothing)."""
    key = json.dumps(data, sort_keys=True)
    if key not in known:
        path = token_cache.existing_cache(DataSpec.of(data))
        known[key] = int(token_cache.read_meta(path)["train"]["tokens"]) if path else None
    return known[key]


def print_table(doc: dict, states: dict[str, str] | None = None, later: Sequence[dict] = (),
                schedule: estimate.Schedule = estimate.ONE_PROCESS) -> None:
    """The dry run's table: the runs of `doc` (with their state: `states`, e.g. ok / failed / train) and `later`
    (the stages not designed yet, as the priors design them: state "later"), each with epochs (passes over the
    training split's tokens) and the time estimate (each run alone); warns where the data repeats. The estimate
    line gives the whole sweep's as `schedule` trains it (what sweep.max_hours bounds), and one at a time beside a
    packed one."""
    known: dict = {}
    runs, states = [*doc["runs"], *later], {**(states or {}), **{r["run_id"]: "later" for r in later}}
    # each row of seq_len targets reads seq_len + 1 tokens of the split, as the run's summary counts them
    epochs = [token_cache.epochs(r["tokens"] * (r["config"]["data"]["seq_len"] + 1) / r["config"]["data"]["seq_len"],
                                 _train_split_tokens(r["config"]["data"], known)) for r in runs]
    print(f"sweep {doc['name']} ({doc['mode']}): {len(runs)} runs")
    print(f"{'#':>3}  {'state':<8} {'run_id':<34} {'N':>11} {'D (tokens)':>13} {'epochs':>7} {'steps':>7} {'batch':>5} "
          f"{'lr':>9} {'C (FLOPs)':>10} {'est.':>8}")
    for i, (r, e) in enumerate(zip(runs, epochs)):
        print(f"{i if i < len(doc['runs']) else '-':>3}  {states.get(r['run_id'], ''):<8} {r['run_id']:<34} "
              f"{r['params']:>11,} {r['tokens']:>13,} {'?' if e is None else f'{e:.3g}':>7} {r['steps']:>7} "
              f"{r['batch_size']:>5} {r['learning_rate']:>9.3g} {format_flops(r['flops']):>10} "
              f"{_duration(r['estimated_seconds']):>8}")
    for note in doc["notes"]:
        print(f"note: {note}")
    repeated = [e for e in epochs if e is not None and e > 1]
    if repeated:
        print(f"warning: {len(repeated)} runs see their training data more than once (up to {max(repeated):.2g} "
              f"epochs): up to ~4 epochs repeated tokens are worth almost as much as fresh ones, beyond that much "
              f"less, and a fit that assumes fresh data overstates what more tokens buy (Muennighoff et al. 2023)")
    if any(e is None for e in epochs):
        print("note: epochs (?) are unknown until the data is tokenized: python -m experiments.prepare_data "
              "--config=<this sweep's config> (or the first run) builds the token cache")
    else:
        print(epochs_line(runs, epochs))
    s = doc["sweep"]
    if s.get("max_hours"):
        print(f"time limit: sweep.max_hours={s['max_hours']:g} h ({_duration(s['max_hours'] * 3600)})")
    total_flops = sum(r["flops"] for r in runs)
    compile_s, setup_s = s.get("estimate_compile_s", 0.0), s.get("estimate_setup_s", 0.0)
    one = sum(r["estimated_seconds"] for r in runs) + setup_s
    seconds = estimate.sweep_seconds(runs, s, schedule.pack) + setup_s
    print(f"total {format_flops(total_flops)} FLOPs; estimated {_duration(seconds)} {schedule.how}"
          + (f" (one at a time: {_duration(one)})" if schedule.how != estimate.ONE_PROCESS.how else "") + " at "
          f"{s['estimate_flops_per_second']:.3g} FLOP/s sustained + {s['estimate_step_overhead_s'] * 1e3:.3g} ms per "
          f"step + {s['estimate_run_overhead_s']:.3g} s per run"
          + (f" + {compile_s:.3g} s compilation per run" if compile_s else "")
          + (f" + {setup_s:.3g} s set-up" if setup_s else "") + " (sweep.estimate_*"
          + (f": {s['estimate_source']}" if s.get("estimate_source") else "") + ")")


def epochs_line(runs: Sequence[dict], epochs: Sequence[float]) -> str:
    """'epochs, the most in each stage: C1e11 0.098, C2e11 0.2, validate 1.6' (passes over the training split)."""
    most: dict[str, float] = {}
    for r, e in zip(runs, epochs):
        most[r.get("stage") or "-"] = max(most.get(r.get("stage") or "-", 0.0), e)
    return "epochs (passes over the training split), the most in each stage: " + ", ".join(
        f"{stage} {e:.2g}" for stage, e in most.items())


def _runs(n: int) -> str:
    return f"{n} run" + "s" * (n != 1)


def _stages(runs: Sequence[dict]) -> str:
    return ", ".join(dict.fromkeys(r["stage"] or "-" for r in runs))


def later_line(later: Sequence[dict]) -> str:
    """'about 9 runs in the stages not designed yet (C2e11, C4e11, validate)'."""
    return f"about {_runs(len(later))} in the stages not designed yet ({_stages(later)})"


def remaining(todo: Sequence[dict], later: Sequence[dict], waiting: str | None = None) -> str:
    """What is left of a sweep: 'stage C3e9: 3 runs (d8-…, …); then about 1 run in the stages not designed yet
    (validate)', or, with nothing designed to train and the plan `waiting` for the prediction, 'the prediction
    (…); then …'."""
    if todo:
        out = f"stage {_stages(todo)}: {_runs(len(todo))} ({', '.join(r['run_id'] for r in todo)})"
    else:
        out = "the prediction (the fit of the recorded grid)" if waiting == "prediction" else "nothing to train"
    return out + (f"; then {later_line(later)}" if later else "")


def print_dry_run(workdir: str, ns: Any, later: Sequence[dict], slots_for: Callable[[list], list] | None = None,
                  fitted: bool = False, assumed: bool = False,
                  schedule: estimate.Schedule = estimate.ONE_PROCESS) -> None:
    """What the command would do now, from next_stage without writing (`ns`): the table, the rows it would record
    or drop first, the prediction it would make first, the runs it would train now (the real run's todo) and
    those of the stages not designed yet (`later`), with the time left (Progress's ETA, each stage packed as
    `schedule` packs it, from the slots `slots_for(units)` gives: runner.schedule, default one in this process;
    calibrated on the sweep's finished runs where it has some; against one at a time where runs share a GPU, which
    sweep.estimate_device_memory_gb may only assume: `assumed`). `fitted`: the fit DIR holds was made from these
    rows (a finished sweep's rerun prints it)."""
    doc = ns.doc
    states = {**{rid: row["status"] for rid, row in ns.rows.items()}, **{r["run_id"]: "train" for r in ns.todo}}
    print_table(doc, states, later, schedule)
    if ns.recovered:
        print(f"{_runs(len(ns.recovered))} finished without a results row; the command records them from their run "
              f"directories first: {', '.join(ns.recovered)}")
    if ns.retried:
        print(f"--retry_failed: {_runs(len(ns.retried))} that failed would train again: {', '.join(ns.retried)}")
    if ns.plan.waiting == "prediction":
        print(f"the grid is recorded: the command first fits it and writes {workdir}/fit/predictions.json, then "
              f"designs the validation run from that prediction and trains it")
    done = [r for r in doc["runs"] if r["run_id"] in ns.rows]
    if not ns.todo and not ns.plan.waiting:
        print(f"0 runs would train: all {len(doc['runs'])} runs of {workdir} are recorded; the command would "
              + ("print the fit made from them" if fitted else "fit them"))
        return
    slots_for = slots_for or (lambda units: [packing.Slot(0, None, 1)])
    slots = slots_for(units_of(ns.todo or later, unit_key(doc["sweep"])))
    seconds, basis = Progress(doc["runs"], ns.rows, later, settings=doc["sweep"], pack=schedule.pack).eta()
    setup = 0.0 if ns.rows else doc["sweep"].get("estimate_setup_s", 0.0)  # nothing trained yet: the set-up is ahead
    seconds += setup
    print(f"{_runs(len(ns.todo))} would train now (stage {_stages(ns.todo)}): {' '.join(r['run_id'] for r in ns.todo)}"
          if ns.todo else "no run would train before the prediction")
    if later:
        print(f"then {later_line(later)}, each designed from the results of those before (the rows marked later: "
              f"as the priors design them)")
    if done:
        print(f"{_runs(len(done))} recorded in {workdir}/results.jsonl")
    where = ""
    if slots[0].gpu is not None:  # several runs share a device: what that buys against one at a time
        one = Progress(doc["runs"], ns.rows, later, 1, settings=doc["sweep"]).eta()[0] + setup
        where = (f" with {packing.describe(slots)}" + (f" (sweep.estimate_device_memory_gb="
                 f"{doc['sweep']['estimate_device_memory_gb']:g}: no GPU is visible here)" if assumed else "")
                 + f"; one at a time: about {_duration(one)}")
    print(f"time left: about {_duration(seconds)} ({basis}){where}")
