"""What a sweep prints: the dry run's table of runs (epochs, time estimate) and the runner's progress lines
(done/running/failed/diverged/total, what happened, an ETA)."""
from __future__ import annotations

import json
import time
from typing import Any, Sequence

from transformer.data import token_cache
from transformer.design.grid import format_flops
from transformer.spec import DataSpec


class Progress:
    """One line per event: done/running/failed/total, what happened, and an ETA for the whole sweep: the runs
    of this stage not yet finished plus `later_seconds`, the estimate of the stages not designed yet (plan.design's
    preview), rescaled by how the runs finished so far in this session compared with their estimates (before the
    first: by how the recorded runs' wall_seconds compared with theirs, so a resumed sweep keeps its speed)."""

    def __init__(self, runs: Sequence[dict[str, Any]], recorded: dict[str, dict], later_seconds: float = 0.0):
        self.t0 = time.time()
        self.estimate_done = 0.0  # estimated seconds of the runs finished in this session
        self.stage(runs, recorded, later_seconds)

    def stage(self, runs: Sequence[dict[str, Any]], recorded: dict[str, dict], later_seconds: float = 0.0) -> None:
        """The runs of the sweep designed so far (a new stage keeps the measured speed)."""
        self.runs = {r["run_id"]: r for r in runs}
        self.status = {rid: row.get("status") for rid, row in recorded.items() if rid in self.runs}
        self.running: set[str] = set()
        self.later_seconds = float(later_seconds)
        timed = [(row["wall_seconds"], self.runs[rid]["estimated_seconds"]) for rid, row in recorded.items()
                 if rid in self.runs and row.get("status") == "ok" and row.get("wall_seconds")]
        # a resumed sweep: the speed its recorded runs measured, until a run of this session finishes
        self.recorded_ratio = sum(w for w, _ in timed) / sum(e for _, e in timed) if timed else None

    def eta_seconds(self) -> float:
        """Seconds left for the whole sweep (see the class docstring)."""
        left = [r for rid, r in self.runs.items() if rid not in self.status]
        seconds = sum(r["estimated_seconds"] for r in left) + self.later_seconds
        if self.estimate_done > 0:
            seconds *= (time.time() - self.t0) / self.estimate_done
        elif self.recorded_ratio:
            seconds *= self.recorded_ratio
        return seconds

    def _eta(self) -> str:
        seconds = self.eta_seconds()
        if seconds <= 0:
            return "0s"
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m" if seconds >= 3600 else \
            f"{int(seconds // 60)}m{int(seconds % 60):02d}s"

    def event(self, message: str) -> None:
        done = sum(1 for s in self.status.values() if s == "ok")
        diverged = sum(1 for s in self.status.values() if s == "diverged")
        failed = len(self.status) - done - diverged
        print(f"[sweep {len(self.status)}/{len(self.runs)} done, {len(self.running)} running, {failed} failed, "
              + (f"{diverged} diverged, " if diverged else "") + f"ETA {self._eta()}] {message}", flush=True)

    def started(self, run: dict[str, Any]) -> None:
        self.running.add(run["run_id"])
        self.event(f"start {run['run_id']}: N={run['params']:,}, {run['steps']} steps, lr {run['learning_rate']:.3g}")

    def finished(self, run: dict[str, Any], row: dict[str, Any] | None, note: str = "") -> None:
        self.running.discard(run["run_id"])
        if row is None:
            self.event(f"stopped {run['run_id']} {note}".rstrip())
            return
        self.status[run["run_id"]] = row["status"]
        self.estimate_done += run["estimated_seconds"]
        if row["status"] == "ok":
            self.event(f"done {run['run_id']}: eval_loss {row['eval_loss']:.4f} in {row['wall_seconds']:.0f}s")
        else:  # "diverged" or "failed" (sweeps/execute.verdict)
            self.event(f"{row['status'].upper()} {run['run_id']}: {row['error']}")


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


def print_table(doc: dict) -> None:
    """The dry run's table of runs (with epochs: passes over the training split's tokens) and the time
    estimate; warns where the data repeats."""
    known: dict = {}
    # each row of seq_len targets reads seq_len + 1 tokens of the split, as the run's summary counts them
    epochs = [token_cache.epochs(r["tokens"] * (r["config"]["data"]["seq_len"] + 1) / r["config"]["data"]["seq_len"],
                                 _train_split_tokens(r["config"]["data"], known)) for r in doc["runs"]]
    print(f"sweep {doc['name']} ({doc['mode']}): {len(doc['runs'])} runs")
    print(f"{'#':>3}  {'run_id':<34} {'N':>11} {'D (tokens)':>13} {'epochs':>7} {'steps':>7} {'batch':>5} {'lr':>9} "
          f"{'C (FLOPs)':>10} {'est.':>8}")
    for i, (r, e) in enumerate(zip(doc["runs"], epochs)):
        print(f"{i:>3}  {r['run_id']:<34} {r['params']:>11,} {r['tokens']:>13,} {'?' if e is None else f'{e:.3g}':>7} "
              f"{r['steps']:>7} {r['batch_size']:>5} {r['learning_rate']:>9.3g} {format_flops(r['flops']):>10} "
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
    s = doc["sweep"]
    if s.get("max_hours"):
        print(f"time limit: sweep.max_hours={s['max_hours']:g} h")
    total_flops = sum(r["flops"] for r in doc["runs"])
    print(f"total {format_flops(total_flops)} FLOPs; estimated {_duration(doc['estimated_seconds'])} in one process "
          f"at {s['estimate_flops_per_second']:.3g} FLOP/s sustained + {s['estimate_step_overhead_s'] * 1e3:.0f} ms "
          f"per step + {s['estimate_run_overhead_s']:.0f} s per run (sweep.estimate_*)")
