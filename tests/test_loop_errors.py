"""How a run ends when something goes wrong: the real error reaches the caller and summary.json records it
(a failed step that had consumed its donated state must not be replaced by "Array has been deleted"); and
summary.json says "ok" only once the last checkpoint is durable (the asynchronous save awaited first)."""
from __future__ import annotations

import itertools
import json
import os

import pytest

from configs import lm
from transformer.training import checkpointing, loop


def _config(corpus_dir: str, **train):
    c = lm.get_config("gpt2_tiny")
    c.data.data_dir, c.data.seq_len = corpus_dir, 32
    c.train.update(dict(steps=4, batch_size=8, warmup_steps=1, log_every=2, eval_every=4, eval_steps=1,
                        checkpoint_every=2), **train)
    return c


class StepFault(RuntimeError):
    pass


@pytest.mark.slow  # CI's 15 minutes: 17 s of the default run on 2 loaded cores (2026-11-27)
def test_an_error_after_a_donated_step_is_raised_and_recorded(tmp_path, corpus_dir, monkeypatch):
    compile_step = loop.compile_step

    def failing_at_step_2(step_fn, state, batch_spec):
        compiled, calls = compile_step(step_fn, state, batch_spec), itertools.count(1)

        def step(state, batch):
            out = compiled(state, batch)  # `state` is donated: deleted from here on
            if next(calls) == 2:  # before any log step fetched a value of the state
                raise StepFault("a fault after the step consumed its state")
            return out
        return step

    monkeypatch.setattr(loop, "compile_step", failing_at_step_2)
    workdir = str(tmp_path / "run")
    # "skip": the summary reads the skipped-update count from the (deleted) optimizer state
    with pytest.raises(StepFault, match="consumed its state"):
        loop.train(_config(corpus_dir, nonfinite="skip"), workdir, verbose=False)
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["status"] == "failed" and summary["error"].startswith("StepFault: a fault after the step")
    assert summary["step"] == 1 and summary["skipped_updates"] is None  # never logged


@pytest.mark.slow  # CI's 15 minutes: 17 s of the default run on 2 loaded cores (2026-11-27)
def test_summary_says_ok_only_once_the_last_checkpoint_is_durable(tmp_path, corpus_dir, monkeypatch):
    pending: list[int] = []  # saves handed to orbax's background thread and not yet awaited
    seen = {}

    class Recording(checkpointing.Checkpointer):
        def save(self, step, *args, **kwargs):
            pending.append(step)
            return super().save(step, *args, **kwargs)

        def wait(self):
            super().wait()
            pending.clear()

        def close(self):
            super().close()
            pending.clear()

    write_json = loop.write_json

    def checking(path, obj):
        if path.endswith("summary.json"):
            seen.update(status=obj["status"], pending=list(pending),
                        marker=os.path.exists(os.path.join(os.path.dirname(path), "checkpoints", "4",
                                                           checkpointing.COMMIT_MARKER)))
        write_json(path, obj)

    monkeypatch.setattr(checkpointing, "Checkpointer", Recording)
    monkeypatch.setattr(loop, "write_json", checking)
    assert loop.train(_config(corpus_dir), str(tmp_path / "run"), verbose=False)["status"] == "ok"
    assert seen == {"status": "ok", "pending": [], "marker": True}, seen


@pytest.mark.slow  # trains a few steps (~17 s on 2 loaded cores)
def test_a_summary_that_cannot_be_written_after_the_run_failed_leaves_the_runs_own_error(tmp_path, corpus_dir,
                                                                                         monkeypatch, capsys):
    """A disk that fills at a checkpoint has no room for summary.json either: the caller sees the run's own error,
    and the summary's is a warning (before, the summary's OSError replaced the run's error)."""
    compile_step = loop.compile_step

    def failing_at_step_2(step_fn, state, batch_spec):
        compiled, calls = compile_step(step_fn, state, batch_spec), itertools.count(1)

        def step(state, batch):
            if next(calls) == 2:
                raise StepFault("the run's own error")
            return compiled(state, batch)
        return step

    def full_disk(path, obj):
        if os.path.basename(path) == "summary.json":
            raise OSError(28, "No space left on device", path)
        return write_json(path, obj)
    write_json = loop.write_json
    monkeypatch.setattr(loop, "compile_step", failing_at_step_2)
    monkeypatch.setattr(loop, "write_json", full_disk)
    with pytest.raises(StepFault, match="the run's own error"):
        loop.train(_config(corpus_dir), str(tmp_path / "run"), verbose=False)
    assert "summary.json not written after the run failed: OSError: [Errno 28] No space left" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run" / "summary.json")
