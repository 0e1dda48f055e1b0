"""Training tasks: what a batch holds and how a model turns it into logits, targets and weights.

The training loop is family-agnostic; a task ties a model family to its data and objective:
  lm               decoder-only next-token prediction        (model.family = decoder)
  mlm              BERT masked-token prediction              (model.family = encoder)
  classify         snippet -> standard-library package       (model.family = encoder, model.num_classes > 0)
  span_corruption  T5 span corruption, teacher forcing       (model.family = encoder_decoder)
Select with `train.task` ("" = the family's default). Which family supports which task is spec.FAMILY_TASKS
(checked in the spec: spec.run_task). Adding a task is one file here, a line in TASKS and one in FAMILY_TASKS.
A task that appends special ids to the tokenizer's vocabulary (MASK, sentinels) has
`vocab_size(spec, tokenizer)`; `model_vocab_size` gives what the model's vocabulary must cover.
"""
from __future__ import annotations

from typing import Any

from transformer.spec import FAMILY_TASKS, run_task
from transformer.tasks.base import Task
from transformer.tasks.classify import ClassifyTask
from transformer.tasks.lm import LMTask
from transformer.tasks.mlm import MLMTask
from transformer.tasks.seq2seq import SpanCorruptionTask

TASKS: dict[str, type] = {"lm": LMTask, "mlm": MLMTask, "classify": ClassifyTask,
                          "span_corruption": SpanCorruptionTask}
DEFAULT_TASK = {family: tasks[0] for family, tasks in FAMILY_TASKS.items()}
assert set(TASKS) == {t for tasks in FAMILY_TASKS.values() for t in tasks}


def get_task(spec: Any) -> Task:
    """The task of a run: `spec` is its RunSpec (or its config: anything with .train.task and .model.family);
    a task its family does not support is a ConfigError (spec.run_task)."""
    return TASKS[run_task(spec.model.family, getattr(spec.train, "task", ""))]()


def model_vocab_size(spec: Any, tokenizer: Any) -> int:
    """The vocabulary the model must cover: the tokenizer's plus the task's special ids (`spec`: as get_task's)."""
    task = get_task(spec)
    return task.vocab_size(spec, tokenizer) if hasattr(task, "vocab_size") else tokenizer.vocab_size
