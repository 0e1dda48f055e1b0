"""Training tasks: what a batch holds and how a model turns it into logits, targets and weights.

The training loop is family-agnostic; a task ties a model family to its data and objective:
  lm               decoder-only next-token prediction        (model.family = decoder)
Select with `train.task` ("" = the family's default). Adding a task is one file here plus a line in TASKS.
"""
from __future__ import annotations

from typing import Any

from transformer.models.config import ConfigError
from transformer.tasks.base import Task
from transformer.tasks.lm import LMTask

TASKS: dict[str, type] = {"lm": LMTask}
DEFAULT_TASK = {"decoder": "lm"}


def get_task(config: Any) -> Task:
    name = config.train.get("task", "") or DEFAULT_TASK.get(config.model.family, "")
    if name not in TASKS:
        raise ConfigError(f"train.task={name!r} is not valid for model.family={config.model.family!r}; "
                          f"choose one of {', '.join(TASKS)}")
    return TASKS[name]()
