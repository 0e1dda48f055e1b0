"""Metrics sinks: DIR/metrics.jsonl (one JSON object per logged step) and TensorBoard events.

Only process 0 writes. On resume, rows logged after the restored checkpoint are dropped first, so the
file of an interrupted-and-resumed run equals that of an uninterrupted one.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


class MetricsWriter:
    def __init__(self, workdir: str, *, enabled: bool = True, resume_step: int = 0):
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = None
        if not enabled:
            return
        self._truncate_after(resume_step)
        from tensorboardX import SummaryWriter  # no TensorFlow needed
        # purge_step: TensorBoard drops the earlier event files' points from this step on (those logged
        # after the restored checkpoint by the interrupted run), as the JSONL truncation does.
        self._tb = SummaryWriter(logdir=workdir, flush_secs=30, purge_step=resume_step + 1 if resume_step else None)
        self._file = open(self.path, "a", buffering=1)

    def _truncate_after(self, step: int) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            rows = [line for line in f if line.strip()]
        keep = []
        for line in rows:
            try:
                if json.loads(line)["step"] <= step:
                    keep.append(line)
            except (ValueError, KeyError):
                continue  # a half-written last line from a kill
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(keep)
        os.replace(tmp, self.path)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _clean(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and v is not None and math.isfinite(v):
                self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            self._tb.close()


def read_metrics(workdir: str) -> list[dict]:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
