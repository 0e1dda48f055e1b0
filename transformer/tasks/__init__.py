"""Training tasks: what a batch holds and how a model turns it into logits, targets and weights.

The training loop is family-agnostic; a task ties a model family to its data and objective:
  lm               decoder-only next-token prediction        (model.family = decoder)
  mlm              BERT masked-token prediction              (model.family = encoder)
  classify         snippet -> standard-library package       (model.family = encoder, model.num_classes > 0)
  span_corruption  T5 span corruption, teacher forcing       (model.family = encoder_decoder)
Select with `train.task` ("" = the family's default). Adding a task is one file here plus a line in TASKS.
A task that appends special ids to the tokenizer's vocabulary (MASK, sentinels) has
`vocab_size(spec, tokenizer)`; `model_vocab_size` gives what the model's vocabulary must cover.
"""
from __future__ import annotations

from typing import Any

from transformer.spec import ConfigError
from transformer.tasks.base import Task
from transformer.tasks.classify import ClassifyTask
from transformer.tasks.lm import LMTask
from transformer.tasks.mlm import MLMTask
from transformer.tasks.seq2seq import SpanCorruptionTask

TASKS: dict[str, type] = {"lm": LMTask, "mlm": MLMTask, "classify": ClassifyTask,
                          "span_corruption": SpanCorruptionTask}
DEFAULT_TASK = {"decoder": "lm", "encoder": "mlm", "encoder_decoder": "span_corruption"}


def get_task(spec: Any) -> Task:
    """The task of a run: `spec` is its RunSpec (or its config: anything with .train.task and .model.family)."""
    name = getattr(spec.train, "task", "") or DEFAULT_TASK.get(spec.model.family, "")
    if name not in TASKS:
        raise ConfigError(f"train.task={name!r} is not valid for model.family={spec.model.family!r}; "
                          f"choose one of {', '.join(TASKS)}")
    return TASKS[name]()


def model_vocab_size(spec: Any, tokenizer: Any) -> int:
    """The vocabulary the model must cover: the tokenizer's plus the task's special ids (`spec`: as get_task's)."""
    task = get_task(spec)
    return task.vocab_size(spec, tokenizer) if hasattr(task, "vocab_size") else tokenizer.vocab_size
