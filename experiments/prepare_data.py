"""Tokenize a config's data into the token cache ahead of training:
python -m experiments.prepare_data --config=configs/lm.py[:PRESET] [--config.data.files=GLOB ...]
python -m experiments.prepare_data --config=configs/sweeps/NAME.py [--config.base.data.KEY=V ...]

Training does the same on first use; this builds the cache once, e.g. before a sweep (every run of the
sweep then reads it, and the sweep's --dry_run can show each run's epochs). The data is local files
(`data.files`) or a TFDS dataset (`data.tfds_name`); a sweep config's data is its `base.data`. Prints the
cache's directory and its document/token/byte counts per split.

--verify: checks every file of the cache (built now or before) against the sizes and SHA-256 digests recorded
when it was built; a damaged cache is one error naming the file ("delete it to rebuild"). Without it an existing
cache is checked as a run checks it: sizes, and digests once per process (so also here).

--compare_tokenizers (a Hugging Face tokenizer.json only; for BENCHMARKS.md): builds the cache timed (an existing
cache of these data and tokenizer is rebuilt), then times the `tokenizers` library's own `encode_batch` on the
same documents in the same blocks (reading them is not timed), and adds both rates and their ratio to the JSON
line (`tokenize`): `ratio` from wall-clock time, `cpu_ratio` from the process's CPU time (every thread), the one
to read on a machine shared with other work.
"""
from __future__ import annotations

import json
import os
import shutil
import time

from absl import flags
from ml_collections import config_flags

from experiments import cli
from experiments._paths import absolute_config

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/lm.py:gpt2_small.")
_VERIFY = flags.DEFINE_bool("verify", False, "Check every file of the token cache against the sizes and SHA-256 "
                            "digests recorded when it was built.")
_COMPARE = flags.DEFINE_bool("compare_tokenizers", False, "Time the cache build against tokenizers' encode_batch "
                             "on the same text (rebuilds the cache).")


def reference_rate(data_cfg, tokenizer) -> dict:
    """tokens/s of `tokenizers`' encode_batch alone over the cache's documents (bos + ids + eos each, as cached),
    in blocks of the size the cache build hands it."""
    from transformer.data import sources, token_cache

    seconds, cpu_seconds, tokens = 0.0, 0.0, 0
    raw = tokenizer._tok  # the tokenizers.Tokenizer itself
    for split in token_cache.SPLITS:
        for block in token_cache._batches(sources.texts(data_cfg, split)):
            start, cpu_start = time.perf_counter(), _cpu()
            encoded = raw.encode_batch(block, add_special_tokens=False)
            seconds, cpu_seconds = seconds + time.perf_counter() - start, cpu_seconds + _cpu() - cpu_start
            tokens += sum(len(e.ids) + 2 for e in encoded)
    return {"tokens": tokens, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "tokens_per_second": tokens / max(seconds, 1e-9)}


def _cpu() -> float:
    """CPU seconds of this process, all threads (the tokenizer's too): robust to other processes' load."""
    t = os.times()
    return t.user + t.system


def main(argv: list[str]) -> None:
    del argv
    from transformer.data import identity, token_cache
    from transformer.data.tokenizers import HFTokenizer
    from transformer.spec import ConfigError, DataSpec

    config = absolute_config(_CONFIG.value)
    data_cfg = config.base.data if "base" in config else config.data
    data = identity.resolve_data(data_cfg)  # the settings checked as a training run checks them
    tokenizer = data.tokenizer
    extra = {}
    if _COMPARE.value:
        if not isinstance(tokenizer, HFTokenizer):
            raise ConfigError("--compare_tokenizers needs data.tokenizer to be a Hugging Face tokenizer.json")
        shutil.rmtree(data.cache_path, ignore_errors=True)
        start, cpu_start = time.perf_counter(), _cpu()
    path = data.ensure_cache()
    meta = token_cache.verify(path, digests=True) if _VERIFY.value else token_cache.read_meta(path)
    if _VERIFY.value:
        extra["verified"] = sorted(meta[token_cache.MANIFEST_KEY])
    if _COMPARE.value:
        seconds, cpu_seconds = time.perf_counter() - start, _cpu() - cpu_start
        tokens = sum(meta[s]["tokens"] for s in token_cache.SPLITS)
        ref = reference_rate(DataSpec.of(data_cfg), tokenizer)
        if ref["tokens"] != tokens:
            raise AssertionError(f"encode_batch gave {ref['tokens']} tokens, the cache holds {tokens}")
        extra["tokenize"] = {"bytes": sum(meta[s]["bytes"] for s in token_cache.SPLITS), "tokens": tokens,
                             "seconds": seconds, "tokens_per_second": tokens / seconds,
                             "encode_batch_seconds": ref["seconds"],
                             "encode_batch_tokens_per_second": ref["tokens_per_second"],
                             "ratio": tokens / seconds / ref["tokens_per_second"],
                             "cpu_seconds": cpu_seconds, "encode_batch_cpu_seconds": ref["cpu_seconds"],
                             "cpu_ratio": ref["cpu_seconds"] / cpu_seconds, "cpus": os.cpu_count(),
                             "load_average": os.getloadavg()}
    print(json.dumps({"cache": path, **{s: {k: meta[s][k] for k in ("documents", "tokens", "bytes")}
                                        for s in token_cache.SPLITS}, **extra}))


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    cli.run(main)
