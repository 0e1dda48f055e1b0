"""What a sweep prints: the dry run's table of runs (epochs, time estimate) and the runner's progress lines
(done/running/failed/diverged/total, what happened, an ETA)."""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Mapping, Sequence

from transformer.data import token_cache
from transformer.design.grid import format_flops
from transformer.sweeps import packing
from transformer.spec import DataSpec


def trained_flops(run: dict[str, Any]) -> float:
    """The FLOPs a run (as sweep.json lists it) trains: all of them, or a branch's from its start step."""
    steps = max(int(run["steps"]), 1)
    return float(run["flops"]) * (steps - int(run.get("start_step") or 0)) / steps


class Progress:
    """One line per event: done/running/failed/total, what happened, and an ETA for the whole sweep: the runs of
    the stages designed so far not yet finished (those running less the time they have run) plus `later`, the runs
    of the stages not designed yet (next_stage.later_runs: the priors' guess), divided among `parallel` workers.
    Each run is costed at the measured rate once a run of this sweep has finished — seconds per trained FLOP of its
    ok runs (wall_seconds / trained_flops, recorded before this command or finished in it) × the run's trained
    FLOPs — and before that at the prior's estimate (estimated_seconds: sweep.estimate_*); the line says which.
    With the sweep's `settings` (sweep.json's "sweep") the prior's estimate is stage by stage (a stage trains
    after the one before), each stage's units (sweep.multirun: a group is one) packed on its workers
    (plan.packed_seconds): `place(units)` gives (workers, devices) for a stage's units (the runner's slots; default
    `parallel` workers on `devices` devices, one device per worker when None). `clock`: seconds (time.time; a fake
    one in tests)."""

    def __init__(self, runs: Sequence[dict[str, Any]], recorded: dict[str, dict],
                 later: Sequence[dict[str, Any]] = (), parallel: int = 1, clock: Callable[[], float] = time.time,
                 settings: Mapping[str, Any] | None = None, devices: int | None = None,
                 place: Callable[[list[list[dict[str, Any]]]], tuple[int, int]] | None = None):
        self.clock, self.settings, self.place = clock, settings, place
        self.workers(parallel, devices)
        self.measured: dict[str, tuple[float, float]] = {}  # run_id -> (wall seconds, trained FLOPs), ok runs
        self.started_at: dict[str, float] = {}
        self.stage(runs, recorded, later)

    def workers(self, parallel: int, devices: int | None = None) -> None:
        """`parallel` workers on `devices` devices (None: one each) train what is left."""
        self.parallel = max(int(parallel), 1)
        self.devices = max(int(devices), 1) if devices else self.parallel

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
        wall, flops = row.get("wall_seconds") or 0.0, trained_flops(run)
        if row.get("status") == "ok" and wall > 0 and flops > 0:
            self.measured[run["run_id"]] = (float(wall), flops)

    def seconds_per_flop(self) -> float | None:
        """The measured rate (None before a run of this sweep has finished ok)."""
        if not self.measured:
            return None
        return sum(w for w, _ in self.measured.values()) / sum(f for _, f in self.measured.values())

    def eta(self) -> tuple[float, str]:
        """(seconds left for the whole sweep, what they are from: "measured: K runs" or "prior: sweep.estimate_*")."""
        rate, now = self.seconds_per_flop(), self.clock()
        if not rate and self.settings is not None:
            return self._packed_prior(now), "prior: sweep.estimate_*"
        cost = (lambda r: rate * trained_flops(r)) if rate else (lambda r: float(r["estimated_seconds"]))
        seconds = sum(cost(r) for r in self.later)
        for rid, r in self.runs.items():
            if rid not in self.status:
                seconds += max(cost(r) - (now - self.started_at[rid] if rid in self.running else 0.0), 0.0)
        return seconds / self.parallel, (f"measured: {len(self.measured)} run{'s' * (len(self.measured) != 1)}" if rate
                                      else "prior: sweep.estimate_*")

    def _packed_prior(self, now: float) -> float:
        """The prior's seconds left: per stage, its runs not finished (less what the running ones have run) as units
        (sweep.multirun: one per group) of plan.unit_seconds, packed on the stage's workers and devices; summed."""
        from transformer.design.plan import packed_seconds, unit_seconds

        pending = [r for rid, r in self.runs.items() if rid not in self.status] + self.later
        key = unit_key(self.settings)
        total = 0.0
        for stage in dict.fromkeys(r.get("stage", "") for r in pending):
            units = units_of([r for r in pending if r.get("stage", "") == stage], key)
            items = []
            for unit in units:
                alone, device = unit_seconds(unit, self.settings)
                ran = max((now - self.started_at[r["run_id"]] for r in unit if r["run_id"] in self.running),
                          default=0.0)
                left = max(alone - ran, 0.0)
                items.append((left, device * left / alone if alone > 0 else 0.0))
            workers, devices = self.place(units) if self.place else (self.parallel, self.devices)
            total += packed_seconds(items, workers, devices)
        return total

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


def print_table(doc: dict, states: dict[str, str] | None = None, later: Sequence[dict] = ()) -> None:
    """The dry run's table: the runs of `doc` (with their state: `states`, e.g. ok / failed / train) and `later`
    (the stages not designed yet, as the priors design them: state "later"), each with epochs (passes over the
    training split's tokens) and the time estimate; warns where the data repeats."""
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
    seconds = sum(r["estimated_seconds"] for r in runs) + setup_s
    print(f"total {format_flops(total_flops)} FLOPs; estimated {_duration(seconds)} in one process at "
          f"{s['estimate_flops_per_second']:.3g} FLOP/s sustained + {s['estimate_step_overhead_s'] * 1e3:.3g} ms per "
          f"step + {s['estimate_run_overhead_s']:.3g} s per run"
          + (f" + {compile_s:.3g} s compilation per run" if compile_s else "")
          + (f" + {setup_s:.3g} s set-up" if setup_s else "") + " (sweep.estimate_*"
          + (f": {s['estimate_source']}" if s.get("estimate_source") else "") + ")")


def epochs_line(runs: Sequence[dict], epochs: Sequence[float]) -> str:
    """'epochs, the most in each stage: C1e11 0.098, C2e11 0.2, validate 1.6' (passes over the training split)."""
    most: dict[str, float] = {}
    for r, e in zip(runs, epochs):
        most[r["stage"] or "-"] = max(most.get(r["stage"] or "-", 0.0), e)
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
                  fitted: bool = False, assumed: bool = False) -> None:
    """What the command would do now, from next_stage without writing (`ns`): the table, the rows it would record
    or drop first, the prediction it would make first, the runs it would train now (the real run's todo) and
    those of the stages not designed yet (`later`), with the time left (Progress's ETA: at the measured rate
    where runs of the sweep have finished; before, each stage packed on the workers `slots_for(units)` gives it:
    runner.slot_planner, default one in this process, and against one at a time where they share a GPU, which
    sweep.estimate_device_memory_gb may only assume: `assumed`). `fitted`: the fit DIR holds was made from these
    rows (a finished sweep's rerun prints it)."""
    doc = ns.doc
    states = {**{rid: row["status"] for rid, row in ns.rows.items()}, **{r["run_id"]: "train" for r in ns.todo}}
    print_table(doc, states, later)
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
    seconds, basis = Progress(doc["runs"], ns.rows, later, settings=doc["sweep"],
                              place=lambda units: (len(s := slots_for(units)), packing.devices(s))).eta()
    if not ns.rows:  # nothing trained yet: the sweep's one-time set-up is still ahead
        seconds += doc["sweep"].get("estimate_setup_s", 0.0)
    print(f"{_runs(len(ns.todo))} would train now (stage {_stages(ns.todo)}): {' '.join(r['run_id'] for r in ns.todo)}"
          if ns.todo else "no run would train before the prediction")
    if later:
        print(f"then {later_line(later)}, each designed from the results of those before (the rows marked later: "
              f"as the priors design them)")
    if done:
        print(f"{_runs(len(done))} recorded in {workdir}/results.jsonl")
    where = ""
    if slots[0].gpu is not None:  # several runs share a device: what that buys against one at a time
        one = Progress(doc["runs"], ns.rows, later, 1, settings=doc["sweep"]).eta()[0]
        where = (f" with {packing.describe(slots)}" + (f" (sweep.estimate_device_memory_gb="
                 f"{doc['sweep']['estimate_device_memory_gb']:g}: no GPU is visible here)" if assumed else "")
                 + f"; one at a time: about {_duration(one)}")
    print(f"time left: about {_duration(seconds)} ({basis}){where}")
