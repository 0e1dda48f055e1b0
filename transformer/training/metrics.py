"""Metrics sinks: DIR/metrics.jsonl (one JSON object per logged step), TensorBoard events, and a
Weights & Biases run when logging.wandb is on (wandb_run.py). Every row goes to all of them from write().

Only process 0 writes. On resume, rows logged after the restored checkpoint are dropped first, so the
file of an interrupted-and-resumed run equals that of an uninterrupted one; TensorBoard purges them
(purge_step) and W&B keeps its earlier values for those steps (its steps only increase).
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable

from transformer.training import wandb_run


def _keep_write_errors(writer: Any) -> Callable[[], None]:
    """A check that raises the error of the events file's first failed write, naming the file; a no-op until one.

    tensorboardX writes the events file from a thread. A write there that fails (a full disk, a quota) ended that
    thread, its bounded queue filled, and the training's next `add_scalar` blocked forever: a run whose disk filled
    hung instead of stopping (seen 2026-11-28: main thread in `multiprocessing.Queue.put`). Here the writes of the
    file (`EventsWriter.write_event`, `flush`, `close`) keep their OSError instead, the thread lives on and drains
    its queue, nothing more is written after the first failure (no torn record), and the training's thread raises
    the error at its next row or at close."""
    try:  # tensorboardX's EventsWriter: the file itself (2.6.x; its layout has held since 1.x)
        events = writer._get_file_writer().event_writer._ev_writer
        path = events._file_name
    except AttributeError:  # another layout: train unguarded rather than not at all (the test of this fails then)
        return lambda: None
    failed: list[OSError] = []

    def keeping(method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            if failed:
                return None
            try:
                return method(*args)
            except OSError as e:
                failed.append(OSError(e.errno, e.strerror, path))
                return None
        return call

    for name in ("write_event", "flush", "close"):
        setattr(events, name, keeping(getattr(events, name)))

    def check() -> None:
        if failed:
            raise failed[0]
    return check


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


class MetricsWriter:
    def __init__(self, workdir: str, *, enabled: bool = True, resume_step: int = 0, config: dict | None = None):
        """`config`: the run's resolved config (DIR/config.json): its logging.wandb* settings, and the W&B
        run's config."""
        self.enabled = enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = self._wandb = self._summary = None
        self._tb_check: Callable[[], None] = lambda: None
        if not enabled:
            return
        kept, logged_through = self._truncate_after(resume_step)
        from tensorboardX import SummaryWriter  # no TensorFlow needed
        # purge_step: TensorBoard drops the earlier event files' points from this step on (those logged
        # after the restored checkpoint by the interrupted run), as the JSONL truncation does. Written by every
        # writer, a fresh run's too: TensorBoard's Python loader (--load_fast=false) takes a run's first
        # session start for its beginning and purges only at later ones.
        # filename_suffix: the file name's own timestamp has whole seconds, and a writer opened in the same
        # second as the previous one would overwrite its file; TensorBoard reads a run's files in name order.
        self._tb = SummaryWriter(logdir=workdir, flush_secs=30, purge_step=resume_step + 1,
                                 filename_suffix=f".{time.time_ns()}")
        self._tb_check = _keep_write_errors(self._tb)
        self._file = open(self.path, "a", buffering=1)
        if config is not None and wandb_run.enabled(config):
            self._wandb = wandb_run.WandbRun(workdir, config, kept, logged_through)

    def _truncate_after(self, step: int) -> tuple[list[dict], int]:
        """Drops the rows after `step`; returns the rows kept and the last step the file held before."""
        if not os.path.exists(self.path):
            return [], 0
        with open(self.path) as f:
            rows = [line for line in f if line.strip()]
        kept_lines, kept, last = [], [], 0
        for line in rows:
            try:
                row = json.loads(line)
                last = max(last, row["step"])
                if row["step"] <= step:
                    kept_lines.append(line)
                    kept.append(row)
            except (ValueError, KeyError):
                continue  # a half-written last line from a kill
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(kept_lines)
        os.replace(tmp, self.path)
        return kept, last

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _clean(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._tb_check()
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and v is not None and math.isfinite(v):
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(int(step), metrics)

    def set_summary(self, summary: dict) -> None:
        """The run's summary.json, given to W&B as its run summary when the writer closes."""
        self._summary = summary

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            self._tb.close()
            if self._wandb is not None:
                self._wandb.finish(self._summary)
            self._tb_check()  # the W&B run finished first


def read_metrics(workdir: str) -> list[dict]:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
