"""Loglikelihood scoring throughput: this codebase's packed scorer against lm-evaluation-harness's HF backend, same
CPU, same model, same requests (BENCHMARKS.md "Task scoring").

python -m experiments.bench_scoring [--hf_dir=DIR] [--tasks=arc_easy] [--limit=N] [--batch_size=B] [--repeats=K]
    [--layers=L --d_model=D --heads=H --positions=T]

Without --hf_dir a random GPT-2 of the given shape over the bytes tokenizer is written to a temporary directory
(nothing from a hub). Both sides score every request of the tasks (encoded once, as the harness's HF backend
encodes them with add_bos_token=True), `--repeats` times alternating (ours, theirs, ours, …); the best of each is
reported. Our compile time is measured apart (the first call) and left out of the rate. Prints one JSON object:
`requests`, `ours` / `harness` (requests_per_second of each repeat, best), `speedup` (best / best), `rows` (ours:
packed rows; the requests' tokens over rows × T), `compile_seconds`, `max_abs_loglikelihood_diff`,
`same_greedy`, `acc` (each side's, per task), `device`, `torch_threads`, `environment`.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

from absl import flags

from experiments import cli
from experiments._paths import DEFINE_path
from experiments.jax_setup import setup_jax

_HF_DIR = DEFINE_path("hf_dir", None, "A local Hugging Face GPT-2 directory (default: a random one, written here).")
_TASKS = flags.DEFINE_string("tasks", "arc_easy", "Tasks as train.eval_tasks takes them.")
_LIMIT = flags.DEFINE_integer("limit", 0, "Documents per task (0: all).")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Rows (ours) and requests (the harness) per batch.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed passes of each side, alternating.")
_LAYERS = flags.DEFINE_integer("layers", 4, "The random model's layers.")
_D_MODEL = flags.DEFINE_integer("d_model", 256, "The random model's width.")
_HEADS = flags.DEFINE_integer("heads", 4, "The random model's heads.")
_POSITIONS = flags.DEFINE_integer("positions", 256, "The random model's positions (the row length).")


def random_gpt2(path: str, layers: int, d_model: int, heads: int, positions: int) -> str:
    """A random GPT-2 (torch seed 0) over the bytes tokenizer's 259 ids, with its tokenizer, in `path`."""
    import torch
    import transformers

    from transformer.data.tokenizers import ByteTokenizer
    from transformer.interop.hf_tokenizer import save_tokenizer

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=259, n_positions=positions, n_embd=d_model, n_layer=layers,
                                     n_head=heads, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(path)
    save_tokenizer(ByteTokenizer(), path)
    return path


def main(argv: list[str]) -> None:
    del argv
    setup_jax()
    import jax
    import numpy as np
    import torch
    from lm_eval.models.huggingface import HFLM

    from transformer import environment
    from transformer.data import choice_tasks, scoring_rows
    from transformer.spec import eval_tasks
    from transformer.interop import scoring_model
    from transformer.tasks.lm import LMTask
    from transformer.training.scoring import PreparedTask, Scorer

    path = _HF_DIR.value or random_gpt2(tempfile.mkdtemp(prefix="bench_scoring_"), _LAYERS.value, _D_MODEL.value,
                                        _HEADS.value, _POSITIONS.value)
    loaded = scoring_model.load(path, setting="--hf_dir")
    T, B = loaded.seq_len, _BATCH.value
    prepared = [PreparedTask(choice_tasks.load(n, p, _LIMIT.value), loaded.tokenizer, loaded.layout)
                for n, p in eval_tasks.parse(_TASKS.value)]
    encoded = [scoring_rows.encode_pair(loaded.tokenizer, c, x) for p in prepared for c, x in p.task.requests()]
    pairs = [(list(c), list(x)) for c, x, _ in encoded]
    packed = scoring_rows.pack(pairs, T)
    scorer = Scorer(loaded.model, LMTask(), loaded.layout, B)
    t0 = time.perf_counter()
    scorer.score_rows(loaded.params, scoring_rows.pack(pairs[:1], T))  # compiles the one step
    compile_seconds = time.perf_counter() - t0
    harness = HFLM(pretrained=path, add_bos_token=True, dtype="float32", device="cpu", batch_size=B)
    harness_requests = [(("", ""), c, x) for c, x in pairs]
    ours_rates, theirs_rates, ours_out, theirs_out = [], [], None, None
    for _ in range(max(_REPEATS.value, 1)):
        t0 = time.perf_counter()
        ours_out = scorer.score_rows(loaded.params, scoring_rows.pack(pairs, T))[0]
        ours_rates.append(len(pairs) / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        theirs_out = harness._loglikelihood_tokens(harness_requests, disable_tqdm=True)
        theirs_rates.append(len(pairs) / (time.perf_counter() - t0))
    ll_ours, greedy_ours = ours_out
    ll_theirs = np.asarray([a for a, _ in theirs_out])
    acc, i = {}, 0
    for p in prepared:
        n = p.packed.num_requests
        acc[p.task.name] = {"ours": p.metrics(ll_ours[i:i + n])["acc"], "harness": p.metrics(ll_theirs[i:i + n])["acc"]}
        i += n
    tokens = sum(min(len(c) + len(x) - 1, T) for c, x in pairs)  # the positions each request takes
    params = int(sum(np.size(a) for a in jax.tree.leaves(loaded.params)))
    result = {"requests": len(pairs), "model": {"path": path, "seq_len": T, "params": params}, "batch_size": B,
        "ours": {"requests_per_second": ours_rates, "best": max(ours_rates)},
        "harness": {"requests_per_second": theirs_rates, "best": max(theirs_rates)},
        "speedup": max(ours_rates) / max(theirs_rates),
        "rows": {"packed": packed.num_rows, "fill": tokens / (packed.num_rows * T)},
        "compile_seconds": compile_seconds,
        "max_abs_loglikelihood_diff": float(np.max(np.abs(ll_ours - ll_theirs))),
        "same_greedy": bool(np.array_equal(greedy_ours, [g for _, g in theirs_out])), "acc": acc,
        "device": str(jax.devices()[0].device_kind), "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(), "environment": environment.record()}
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    cli.run(main)
