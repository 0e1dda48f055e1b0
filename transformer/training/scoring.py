"""Loglikelihood scoring with a decoder or an encoder–decoder model: requests packed into rows of one shape by the
model's layout (data/scoring_rows.py: a decoder's rows of T positions; an encoder–decoder's context in the encoder
row, continuation in the decoder row) and scored by one compiled step on the run's mesh, B rows at a time.

`Scorer` holds the step; `loglikelihoods(params, requests)` gives each request's loglikelihood and whether its
continuation is the greedy one (lm-evaluation-harness's (logprob, is_greedy)). `TaskEvaluator` is the loop's
evaluation of the train.eval_tasks tasks (data/choice_tasks.py): the documents read and tokenized and the rows
packed once, then scored at every evaluation into tasks/NAME/{acc, acc_norm, bits_per_byte, docs}
(metric_keys). A group's scorer (`runs` > 0) is vmapped over the stacked parameters: every value is then a list of
R (one per run), as the loop's other evaluations give.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer.data import choice_tasks, scoring_rows
from transformer.data.scoring_rows import Layout
from transformer.data.batches import RowBlocks
from transformer.spec import ConfigError, eval_tasks
from transformer.spec import metric_keys
from transformer.training.steps import global_batch


def layout_for(task_name: str, seq_len: int, decoder_start: int | None = None) -> Layout:
    """A model's scoring rows: a decoder's (train.task lm) of `seq_len` positions, or an encoder–decoder's
    (span_corruption) encoder and decoder rows of `seq_len` each, the decoder starting with `decoder_start` (None:
    as a span-corruption run trains, data/span_corruption.DECODER_START_ID)."""
    if task_name == "span_corruption":
        from transformer.data.span_corruption import DECODER_START_ID
        start = DECODER_START_ID if decoder_start is None else decoder_start
        return Layout(seq_len, source_len=seq_len, decoder_start=start)
    return Layout(seq_len)


def make_score_step(model: Any, task: Any):
    """(params, batch) -> {"logprob": float32 [B, T] (the target's log-probability where `weights` > 0, else 0),
    "greedy": bool [B, T] (the target is the argmax)} for the task's batch keys (lm: a decoder's rows;
    span_corruption: an encoder–decoder's, teacher-forced)."""

    def score(params: Any, batch: dict) -> dict:
        logits, targets, weights = task.forward(model, params, batch, deterministic=True, rngs=None)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        return {"logprob": jnp.where(weights > 0, picked, 0.0), "greedy": jnp.argmax(logits, -1) == targets}

    return score


class Scorer:
    """Scores requests in batches of `batch_size` rows of the model's `layout` (data/scoring_rows.Layout) with one
    compiled step.

    `params_sharding` / `batch_sharding`: the run's (None: the default device); `rows`: this process's rows of a
    batch (data.batches.process_rows; None: all of them, one process); `runs` > 0: a group's stacked parameters."""

    def __init__(self, model: Any, task: Any, layout: Layout, batch_size: int, *, params_sharding: Any = None,
                 batch_sharding: Any = None, rows: RowBlocks | None = None, runs: int = 0):
        self.layout, self.batch_size, self.rows, self.runs = layout, int(batch_size), rows, runs
        self.batch_sharding = batch_sharding
        step = make_score_step(model, task)
        if runs:
            step = jax.vmap(step, in_axes=(0, None))
        if batch_sharding is None:
            self.step = jax.jit(step)
        else:
            replicated = jax.sharding.NamedSharding(batch_sharding.mesh, jax.sharding.PartitionSpec())
            self.step = jax.jit(step, in_shardings=(params_sharding, batch_sharding), out_shardings=replicated)

    def _local(self, batch: dict[str, np.ndarray]) -> dict:
        if self.batch_sharding is None:
            return batch
        local = batch if self.rows is None else {k: np.concatenate([v[a:b] for a, b in self.rows])
                                                 for k, v in batch.items()}
        return global_batch(local, self.batch_sharding, self.batch_size)

    def score_rows(self, params: Any, packed: scoring_rows.PackedRows) -> list[tuple[np.ndarray, np.ndarray]]:
        """[(loglikelihood float64 [N], is_greedy bool [N])] per run (one entry for a run alone)."""
        outs = []  # dispatched in turn; fetched once at the end
        for start in range(0, packed.num_rows, self.batch_size):
            outs.append(self.step(params, self._local(packed.batch(start, self.batch_size))))
        fetched = jax.device_get(outs)
        R = (fetched[0]["logprob"].shape[0] if fetched else 0) if self.runs else 1  # a group's live runs
        rows_lp: list[list] = [[] for _ in range(R)]
        rows_greedy: list[list] = [[] for _ in range(R)]
        for out in fetched:
            lp, greedy = np.asarray(out["logprob"]), np.asarray(out["greedy"])
            for r in range(R):
                rows_lp[r].append(lp[r] if self.runs else lp)
                rows_greedy[r].append(greedy[r] if self.runs else greedy)
        n, T = packed.num_rows, self.layout.target_len
        results = []
        for r in range(R):
            lp = np.concatenate(rows_lp[r])[:n] if rows_lp[r] else np.zeros((0, T))
            greedy = np.concatenate(rows_greedy[r])[:n] if rows_greedy[r] else np.zeros((0, T), bool)
            results.append(scoring_rows.reduce(packed, lp, greedy))
        return results

    def loglikelihoods(self, params: Any, requests: Sequence[scoring_rows.Request]) -> tuple[np.ndarray, np.ndarray]:
        """(loglikelihood [N], is_greedy [N]) of (context ids, continuation ids) requests (a run alone)."""
        return self.score_rows(params, self.layout.pack(requests))[0]


class PreparedTask:
    """A task's requests tokenized and packed once (`tokenizer`: the run's; `layout`: the model's rows). A document
    with a continuation longer than the (decoder) rows cannot be scored in one row: it is left out (`skipped_docs`,
    with a warning), and a task left without documents is a ConfigError."""

    def __init__(self, task: choice_tasks.ChoiceTask, tokenizer: Any, layout: Layout, verbose: bool = True):
        seq_len = layout.target_len
        encoded = layout.encode_all(tokenizer, task.requests())
        kept_docs, kept, i = [], [], 0
        for doc in task.docs:
            mine = encoded[i:i + len(doc.continuations)]
            i += len(doc.continuations)
            if all(len(x) <= seq_len for _, x, _ in mine):
                kept_docs.append(doc)
                kept.extend(mine)
        self.skipped_docs = len(task.docs) - len(kept_docs)
        if not kept_docs:
            raise ConfigError(f"{eval_tasks.SETTING}: {task.name}: every document has a continuation longer than "
                              f"the model's {seq_len} positions (data.seq_len); raise it or choose another task")
        if self.skipped_docs and verbose:
            print(f"warning: {eval_tasks.SETTING}: {task.name}: {self.skipped_docs} of {len(task.docs)} documents "
                  f"left out (a continuation longer than {seq_len} tokens)", flush=True)
        self.task = choice_tasks.ChoiceTask(task.name, task.path, tuple(kept_docs))
        self.scored = [s for _, _, s in kept]
        self.packed = layout.pack([(c, x) for c, x, _ in kept])
        self.layout = layout  # the rows it was packed for: the scorer's (training/evaluators.py)

    def metrics(self, loglikelihoods: np.ndarray) -> dict[str, float]:
        return choice_tasks.metrics(self.task, loglikelihoods, self.scored)


def prepare_tasks(value: str, limit: int, tokenizer: Any, layout: Layout, verbose: bool = True) -> list[PreparedTask]:
    """train.eval_tasks (spec/eval_tasks.parse) read, tokenized and packed; `limit`: documents per task (0: all)."""
    return [PreparedTask(choice_tasks.load(name, path, limit), tokenizer, layout, verbose)
            for name, path in eval_tasks.parse(value)]


class TaskEvaluator:
    """One task of train.eval_tasks in the loop's registry: `evaluator(params)` -> its tasks/NAME/... values."""

    def __init__(self, scorer: Scorer, prepared: PreparedTask):
        self.scorer, self.prepared = scorer, prepared

    def __call__(self, params: Any) -> dict[str, Any]:
        per_run = [self.prepared.metrics(ll) for ll, _ in self.scorer.score_rows(params, self.prepared.packed)]
        name = self.prepared.task.name
        return {metric_keys.task_key(name, m): ([p[m] for p in per_run] if self.scorer.runs else per_run[0][m])
                for m in choice_tasks.METRICS}
