"""A profiler window: `jax.profiler` traces of training steps into DIR/profile/ (logging.profile_start,
logging.profile_count).

Steps are numbered as in metrics.jsonl (step 1 is the first update). The trace starts before step
`profile_start` reads its batch and stops after step `profile_start + profile_count - 1` has finished on
the device (the loop dispatches steps asynchronously; the window blocks on its last step, so the trace
holds the window's whole work). Each step is marked with a StepTraceAnnotation, which the profile
plugin's overview page uses for its step-time breakdown. Only process 0 traces. Tracing changes no
result. `tensorboard --logdir DIR` (with the xprof plugin: `pip install '.[profile]'`) shows the
trace, written as DIR/profile/plugins/profile/<time>/<host>.xplane.pb.
"""
from __future__ import annotations

import os
from typing import Any

import jax

from transformer.spec import ConfigError


def window(config: Any) -> tuple[int, int] | None:
    """(first, last) profiled step of a config, or None when profiling is off; ConfigError on a window
    that is not one of the run's steps."""
    start = (config.get("logging") or {}).get("profile_start", 0)  # none in configs older than the section
    if start == 0:
        return None
    count, steps = config["logging"]["profile_count"], config["train"]["steps"]
    for name, value in (("profile_start", start), ("profile_count", count)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"logging.{name}={value!r} must be a non-negative integer")
    if count == 0:
        raise ConfigError("logging.profile_count=0 gives an empty profiler window; trace at least one step "
                          "(or set logging.profile_start=0 to profile nothing)")
    last = start + count - 1
    if last > steps:
        raise ConfigError(f"logging.profile_start={start} with logging.profile_count={count} profiles steps "
                          f"{start}..{last}, beyond train.steps={steps}; choose a window within 1..{steps}")
    return start, last


class ProfileWindow:
    """Call before(s) before step s reads its batch and after(s, outputs) once step s is dispatched;
    close() stops a trace the loop left early (preemption, an error)."""

    def __init__(self, config: Any, workdir: str, *, enabled: bool = True):
        self.window = window(config) if enabled else None
        self.logdir = os.path.join(workdir, "profile")
        self._tracing = False
        self._annotation = None

    def before(self, step: int) -> None:
        if self.window is None:
            return
        first, last = self.window
        if not self._tracing and first <= step <= last:  # a run resumed inside the window traces its rest
            jax.profiler.start_trace(self.logdir)
            self._tracing = True
        if self._tracing:
            self._annotation = jax.profiler.StepTraceAnnotation("train", step_num=step)
            self._annotation.__enter__()

    def after(self, step: int, outputs: Any) -> None:
        if not self._tracing:
            return
        self._annotation.__exit__(None, None, None)
        self._annotation = None
        if step >= self.window[1]:
            jax.block_until_ready(outputs)  # the window's last step has run: the trace holds finished work
            self.close()

    def close(self) -> None:
        if self._annotation is not None:
            self._annotation.__exit__(None, None, None)
            self._annotation = None
        if self._tracing:
            self._tracing = False
            jax.profiler.stop_trace()
