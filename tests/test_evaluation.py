"""Evaluation keeps one eval iterator per run (evaluation.Evaluator): built once, rewound to the same batches at
every evaluation, its sums fetched once per evaluation; its results are those of a fresh iterator each time."""
from __future__ import annotations

import hashlib
import json

import jax
import numpy as np
import pytest

from configs import lm
from transformer.data import get_tokenizer
from transformer.tasks import get_task
from transformer.training import loop
from transformer.training.metrics import read_metrics
from transformer.training.restore import load_run


def _config(corpus_dir: str):
    c = lm.get_config("gpt2_tiny")
    c.data.data_dir, c.data.seq_len = corpus_dir, 32
    c.train.update(steps=6, batch_size=8, warmup_steps=1, log_every=2, eval_every=2, eval_steps=3,
                   checkpoint_every=6)
    return c


def _counting_task(c, made: list):
    """The config's task, counting the eval iterators it makes."""
    task = get_task(c)

    class Counting(type(task)):
        def make_iterator(self, config, **kwargs):
            if kwargs.get("split") == config.data.eval_split:
                made.append(kwargs)
            return super().make_iterator(config, **kwargs)

    counting = Counting.__new__(Counting)
    counting.__dict__.update(task.__dict__)
    return counting


def _fresh_evaluation(c, params, eval_fn, token_bytes_V) -> dict:
    """The evaluation as it was before: a new iterator, every batch fetched and summed in float64 on the host."""
    it = get_task(c).make_iterator(c, split=c.data.eval_split, global_batch_size=c.train.batch_size,
                                   seed=c.data.shuffle_seed, shuffle=True, repeat=True)
    sums, target_bytes = np.zeros(3), 0.0
    for _ in range(c.train.eval_steps):
        b = next(it)
        target_bytes += float(np.sum(token_bytes_V[b["targets"]] * b["weights"], dtype=np.float64))
        out = jax.device_get(eval_fn(params, b))
        sums += [float(out["loss_sum"]), float(out["weight_sum"]), float(out["correct_sum"])]
    it.close()
    return {"eval_loss": sums[0] / sums[1], "eval_accuracy": sums[2] / sums[1],
            "eval_bits_per_byte": sums[0] / (np.log(2) * target_bytes)}


@pytest.mark.slow  # CI's 15 minutes: 17 s of the default run on 2 loaded cores (2026-11-27)
def test_a_run_makes_one_eval_iterator_and_evaluates_like_a_fresh_one(tmp_path, corpus_dir, monkeypatch):
    c, made = _config(corpus_dir), []
    monkeypatch.setattr(loop, "get_task", lambda config: _counting_task(config, made))
    workdir = str(tmp_path / "run")
    summary = loop.train(c, workdir, verbose=False)
    evaluated = [r["step"] for r in read_metrics(workdir) if "eval_loss" in r]
    assert summary["status"] == "ok" and evaluated == [2, 4, 6]
    assert len(made) == 1, f"{len(made)} eval iterators for {len(evaluated)} evaluations (one per run expected)"

    run = load_run(workdir)  # the final parameters, evaluated the old way on one device
    from transformer.training.steps import make_eval_step
    eval_fn = jax.jit(make_eval_step(run.model, get_task(c)))
    expected = _fresh_evaluation(c, run.params, eval_fn, get_tokenizer(c.data, workdir=workdir).byte_lengths())
    for key, value in expected.items():
        assert summary[key] == pytest.approx(value, rel=2e-6), key


def test_every_evaluation_reads_the_same_batches_as_a_fresh_iterator(corpus_dir):
    c, made = _config(corpus_dir), []
    task = _counting_task(c, made)
    seen: list[list[str]] = []

    def eval_fn(params, batch):  # a stand-in step recording which batches it was given
        seen[-1].append(hashlib.sha1(np.asarray(batch["inputs"]).tobytes()).hexdigest())
        w = np.asarray(batch["weights"], np.float64)
        return {"loss_sum": w.sum() * params, "weight_sum": w.sum(), "correct_sum": 0.0}

    from transformer.training.evaluation import Evaluator

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    evaluator = Evaluator(eval_fn, task, c, device, 0, 1, get_tokenizer(c.data).byte_lengths())
    results = []
    for params in (1.0, 2.0, 1.0):
        seen.append([])
        results.append(evaluator(params))
    evaluator.close()
    fresh = task.make_iterator(c, split=c.data.eval_split, global_batch_size=c.train.batch_size,
                               seed=c.data.shuffle_seed, shuffle=True, repeat=True)
    first = [hashlib.sha1(np.asarray(next(fresh)["inputs"]).tobytes()).hexdigest() for _ in range(c.train.eval_steps)]
    fresh.close()
    assert len(made) == 2  # the evaluator's one, and `fresh` above
    assert seen == [first] * 3 and len(set(first)) == c.train.eval_steps
    assert results[0] == results[2] and results[1]["eval_loss"] == pytest.approx(2 * results[0]["eval_loss"])
    assert json.dumps(results[0])  # plain floats
