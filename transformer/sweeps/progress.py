"""The sweep runner's progress lines: done/running/failed/total, what happened, and an ETA."""
from __future__ import annotations

import time
from typing import Any, Sequence


class Progress:
    """One line per event: done/running/failed/total, what happened, and an ETA."""

    def __init__(self, runs: Sequence[dict[str, Any]], recorded: dict[str, dict]):
        self.runs = {r["run_id"]: r for r in runs}
        self.status = {rid: row.get("status") for rid, row in recorded.items() if rid in self.runs}
        self.running: set[str] = set()
        self.t0 = time.time()
        self.estimate_done = 0.0  # estimated seconds of the runs finished in this session

    def _eta(self) -> str:
        """The remaining runs' estimates (FLOPs and steps at the configured speed, plus overhead),
        rescaled by how the runs finished so far compared with their estimates."""
        left = [r for rid, r in self.runs.items() if rid not in self.status]
        if not left:
            return "0s"
        seconds = sum(r["estimated_seconds"] for r in left)
        if self.estimate_done > 0:
            seconds *= (time.time() - self.t0) / self.estimate_done
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m" if seconds >= 3600 else \
            f"{int(seconds // 60)}m{int(seconds % 60):02d}s"

    def event(self, message: str) -> None:
        done = sum(1 for s in self.status.values() if s == "ok")
        failed = sum(1 for s in self.status.values() if s != "ok")
        print(f"[sweep {done + failed}/{len(self.runs)} done, {len(self.running)} running, {failed} failed, "
              f"ETA {self._eta()}] {message}", flush=True)

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
        else:
            self.event(f"FAILED {run['run_id']}: {row['error']}")
