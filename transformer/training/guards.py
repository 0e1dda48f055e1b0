"""The loop's guards: preemption (a signal or `stop_at`, agreed on by every process), non-finite steps
(train.nonfinite) and loss spikes. Each keeps its own state; the loop asks them at its host syncs.

Legend: R runs, p a position on a group's run axis, r a run's index in the loop's `configs`.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from jax.experimental import multihost_utils

from transformer.training import nonfinite


class Preempted(Exception):
    """Raised inside the loop when SIGTERM/SIGINT arrived (or stop_at was reached); the loop checkpoints first."""


_EXTRA_SIGNALS: list[int] = []  # also_preempt_on
_LAST = {"signal": None}


def also_preempt_on(signum: int) -> None:
    """Makes `signum` preempt like SIGTERM in this process from now on: a scheduler's warning before a time
    limit (SLURM's --signal=USR1@120; without a handler USR1 would kill the process without a checkpoint)."""
    if signum not in _EXTRA_SIGNALS:
        _EXTRA_SIGNALS.append(signum)


def last_preemption_signal() -> int | None:
    """The signal that last preempted training in this process (None: none did)."""
    return _LAST["signal"]


@contextlib.contextmanager
def preemption_signals() -> Iterator[dict]:
    """Within the block, SIGTERM/SIGINT (and the also_preempt_on signals) only set flag["signal"] (the loop
    checkpoints, then stops); the previous handlers come back on leaving it."""
    flag = {"signal": None}
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, *_EXTRA_SIGNALS)}

    def on_signal(signum: int, _frame: Any) -> None:
        flag.update(signal=signum)
        _LAST["signal"] = signum

    for s in previous:
        signal.signal(s, on_signal)
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


PREEMPTION_CHECK_SECONDS = 10.0  # with several processes: how often (wall time) they agree on whether to stop


class Preemption:
    """Whether to stop before the next step: a signal arrived (in any process) or `stop_at` was reached.

    Every process must stop at the same step. Alone, the flag is read before every step. With several, the
    flags are gathered (a collective, which also waits for the steps in flight) about every `check_seconds`
    of wall time, independent of train.log_every: each process proposes the step of the next check from its
    own measured seconds per step, and all take the smallest proposal, so they agree without any other
    message. A scheduler's grace period after SIGTERM needs to exceed `check_seconds` plus one checkpoint.
    Use as a context manager: the signal handlers are installed inside it."""

    def __init__(self, stop_at: int | None, process_count: int, check_seconds: float | None = None):
        self.stop_at, self.process_count = stop_at, process_count
        self.check_seconds = PREEMPTION_CHECK_SECONDS if check_seconds is None else check_seconds
        self._signals = contextlib.ExitStack()
        self.flag: dict = {"signal": None}
        self.next_check = 0  # the step of the next gathering (the first step of this invocation: at once)
        self._last: tuple[int, float] | None = None  # (step, time) of the previous gathering

    def __enter__(self) -> Preemption:
        self.flag = self._signals.enter_context(preemption_signals())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._signals.close()

    def should_stop(self, step: int) -> bool:
        if self.stop_at is not None and step >= self.stop_at:
            return True
        if self.process_count == 1:
            return self.flag["signal"] is not None
        if step < self.next_check:
            return False
        now = time.monotonic()
        if self._last is None or step == self._last[0]:
            proposal = step + 1  # no measured step yet
        else:
            seconds_per_step = max((now - self._last[1]) / (step - self._last[0]), 1e-6)
            proposal = step + max(1, int(self.check_seconds / seconds_per_step))
        self._last = (step, now)
        gathered = multihost_utils.process_allgather(
            np.array([self.flag["signal"] is not None, proposal], np.int64)).reshape(-1, 2)
        self.next_check = int(gathered[:, 1].min())
        stop = bool(np.any(gathered[:, 0]))
        if stop and self.flag["signal"] is None:
            self.flag["signal"] = "another process's"
        return stop

    def reason(self) -> str:
        signum = self.flag["signal"]
        return f"received signal {signum}" if signum is not None else f"stop_at={self.stop_at}"


class NonFiniteGuard:
    """train.nonfinite over the steps since the last sync: under "stop" a run alone raises NonFiniteError
    with `diagnose`'s report (replayed from its checkpoint) and a group's run fails and leaves the group;
    under "skip" (optax.apply_if_finite dropped the update), a warning, and the run fails once it has dropped
    more than `max_skipped_fraction` of its `steps` updates (over_limit)."""

    def __init__(self, policy: str, workdirs: Sequence[str], grouped: bool, primary: bool,
                 diagnose: Callable[[int, float], str], steps: int = 0, max_skipped_fraction: float = 1.0):
        self.policy, self.workdirs, self.grouped, self.primary = policy, list(workdirs), grouped, primary
        self.diagnose = diagnose
        self.steps, self.max_skipped_fraction = steps, max_skipped_fraction

    def over_limit(self, skipped: dict[int, int], step: int) -> dict[int, str]:
        """{r: error} for the runs (r: updates dropped so far, at `step`) past the limit. The count only grows,
        so such a run could no longer end as the run its settings describe: it fails now, not at its end."""
        limit = self.max_skipped_fraction * self.steps
        return {r: f"{n} of the {step} updates so far were skipped as non-finite (train.nonfinite='skip'), more "
                   f"than train.max_skipped_fraction={self.max_skipped_fraction} of train.steps={self.steps} allows "
                   f"({int(limit)}). Lower train.learning_rate or raise train.warmup_steps"
                for r, n in skipped.items() if n is not None and n > limit}

    def check(self, fetched: list[tuple[int, dict]], live: Sequence[int], per_run: Callable[[Any, int], Any],
              step: int, replay: bool = True) -> dict[int, str]:
        """{r: error} for the runs that failed in `fetched` ((step, {"loss", "finite"}) host values)."""
        failed = {}
        for p, r in enumerate(live):
            bad = nonfinite.first_bad([(s, per_run(x, p)) for s, x in fetched])
            if bad is None:
                continue
            if self.policy == "stop" and not self.grouped and replay:
                raise nonfinite.NonFiniteError(self.diagnose(*bad))
            if self.policy == "stop":
                failed[r] = nonfinite.describe(*bad, None, None, replayed=False) + (
                    " (trained in a group; train it alone for the name of the first non-finite tensor)"
                    if self.grouped else "")
                if self.grouped:
                    print(f"run {os.path.basename(self.workdirs[r])}: {failed[r]}; the group goes on without it",
                          flush=True)
            elif self.primary:
                n_bad = sum(1 for _, x in fetched if not bool(np.asarray(per_run(x, p)["finite"])))
                print(f"warning: {self.workdirs[r]}: non-finite loss or gradient at step {bad[0]}"
                      f"{f' and {n_bad - 1} more steps up to {step}' if n_bad > 1 else ''}; "
                      f"update skipped (train.nonfinite='skip')", flush=True)
        return failed


class SpikeGuard:
    """Per run, a nonfinite.SpikeDetector over the logged losses (restored from metrics.jsonl on resume);
    a spike is a warning naming the run and its batch, and a `loss_spike` entry in the logged row."""

    def __init__(self, histories: Sequence[Sequence[float | None]], workdirs: Sequence[str],
                 describe_batch: Callable[[int, int], str], primary: bool):
        self.detectors = [nonfinite.SpikeDetector(h) for h in histories]
        self.workdirs, self.describe_batch, self.primary = list(workdirs), describe_batch, primary

    def check(self, r: int, window: list[tuple[int, dict]], logged_loss: float) -> tuple[int, float] | None:
        """(step, ratio) of run r's worst spike in `window` (its own slice), or None; warns (process 0)."""
        spike = self.detectors[r].check(window, logged_loss)
        if spike is not None and self.primary:
            print(f"warning: {self.workdirs[r]}: loss spike at step {spike[0]}: {spike[1]:.2f}x the median of the "
                  f"last {len(self.detectors[r].history) - 1} logged losses; its batch is "
                  f"{self.describe_batch(r, spike[0])} (runs with the same seed saw the same batch)", flush=True)
        return spike


def replay_diagnosis(bad_step: int, bad_loss: float, *, checkpointer: Any, make_iterator: Callable[[], Any],
                     abstract: Any, fresh_state: Callable[[], Any], train_fn: Callable, grad_fn: Callable,
                     to_global: Callable[[dict], dict]) -> str:
    """A run alone: replays from the newest checkpoint (all are older than bad_step; none: from the initial
    state) to the state before it and recomputes that batch's loss and gradients, to name the first non-finite
    tensor (nonfinite.finding, nonfinite.describe)."""
    from_step = None
    try:
        checkpointer.wait()
        it = make_iterator()
        found = checkpointer.restore(abstract, it)
        from_step, st = found if found is not None else (None, fresh_state())
        for _ in range(from_step or 0, bad_step - 1):
            st, _ = train_fn(st, to_global(next(it)))
        loss, grads = grad_fn(st.params, to_global(next(it)), st.step)
        return nonfinite.describe(bad_step, bad_loss, nonfinite.finding(st.params, loss, grads), from_step)
    except Exception as e:  # noqa: BLE001 - the diagnosis must not hide the fault itself
        return nonfinite.describe(bad_step, bad_loss, None, from_step, replayed=False) + \
            f" (the replay failed: {type(e).__name__}: {e})"
