"""The row keys of evaluations beyond the run's own split (standard library only), defined once (here, in the
bottom layer: training writes them, scaling reads them back from a sweep's rows to fit them: `value`):

  eval/NAME/loss, eval/NAME/bits_per_byte          a named evaluation set (data.eval_sets)
  tasks/NAME/acc, tasks/NAME/acc_norm, tasks/NAME/bits_per_byte, tasks/NAME/docs
                                                   a likelihood-scored task (train.eval_tasks)

metrics.jsonl and TensorBoard carry them flat (TensorBoard groups them by the part before the first `/`);
summary.json and a sweep's results.jsonl nest them (`nested`): "eval_sets": {NAME: {loss, bits_per_byte}},
"tasks": {NAME: {acc, acc_norm, bits_per_byte, docs}}. `recorded_metrics`: the keys every run of a training config
records (a sweep's sweep.predict_metrics names some of them).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from transformer.spec import eval_tasks
from transformer.spec.data import eval_set_entries

EVAL_SET_PREFIX = "eval/"
TASK_PREFIX = "tasks/"
OWN_LAST_KEYS = ("train_loss", "eval_loss", "eval_accuracy", "eval_bits_per_byte")  # a run's last values
SUMMARY_GROUPS = {"eval_sets": EVAL_SET_PREFIX, "tasks": TASK_PREFIX}  # summary.json key -> row-key prefix


def eval_set_keys(name: str) -> dict[str, str]:
    """What a named set's evaluation reports -> its row key (evaluation.Evaluator's `keys`)."""
    return {"loss": f"{EVAL_SET_PREFIX}{name}/loss", "bits_per_byte": f"{EVAL_SET_PREFIX}{name}/bits_per_byte"}


def task_key(name: str, metric: str) -> str:
    return f"{TASK_PREFIX}{name}/{metric}"


def keeps_last(key: str) -> bool:
    """Whether a row's `key` is one of the values a run's summary reports as last logged."""
    return key in OWN_LAST_KEYS or key.startswith(tuple(SUMMARY_GROUPS.values()))


def nested(last: dict[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    """{NAME: {metric: value}} of the keys PREFIX + NAME/metric of `last` (names in the order first seen)."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in last.items():
        if key.startswith(prefix):
            name, _, metric = key[len(prefix):].rpartition("/")
            finite = not isinstance(value, float) or math.isfinite(value)
            out.setdefault(name, {})[metric] = value if finite else None
    return out


def summary_groups(last: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """summary.json's "eval_sets" and "tasks" from a run's last logged values."""
    return {group: nested(last, prefix) for group, prefix in SUMMARY_GROUPS.items()}


def flat(groups: dict[str, Any]) -> dict[str, Any]:
    """summary_groups' inverse: {row key: value} of a summary's (or results row's) "eval_sets" and "tasks"."""
    out = {}
    for group, prefix in SUMMARY_GROUPS.items():
        for name, metrics in (groups.get(group) or {}).items():
            out.update({f"{prefix}{name}/{metric}": value for metric, value in metrics.items()})
    return out


def value(record: dict[str, Any], metric: str) -> Any:
    """A results row's (or summary's) value of `metric`: a top-level key (eval_loss, eval_bits_per_byte, ...) or a
    row key of a named set or task (eval/NAME/bits_per_byte, tasks/NAME/bits_per_byte), read from the nested
    "eval_sets" / "tasks"; None when the record lacks it."""
    if metric.startswith(tuple(SUMMARY_GROUPS.values())):
        return flat(record).get(metric)
    return record.get(metric)


def recorded_metrics(base: Mapping[str, Any]) -> list[str]:
    """The metrics every run of a sweep with training config `base` records beside eval_loss, which
    sweep.predict_metrics may name: eval_bits_per_byte, each named set's eval/NAME/bits_per_byte and eval/NAME/loss
    (data.eval_sets), each task's tasks/NAME/bits_per_byte (train.eval_tasks, its tasks located: ConfigError where
    one is not found)."""
    sets = [name for name, _ in eval_set_entries(base.get("data", {}).get("eval_sets", ""))]
    tasks = eval_tasks.names(base.get("train", {}).get("eval_tasks", ""))
    return (["eval_bits_per_byte"] + [key for n in sets for key in sorted(eval_set_keys(n).values())]
            + [task_key(n, "bits_per_byte") for n in tasks])
