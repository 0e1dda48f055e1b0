"""The token cache build is safe with several processes on a shared file system, without file locks (fcntl
locks are unreliable over NFS): one build claim, stale claims taken over, the finished directory renamed into
place; and experiments.prepare_data --compare_tokenizers reports its rate against tokenizers' encode_batch."""
from __future__ import annotations

import errno
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from configs.common import base_config
from transformer.data import get_tokenizer, token_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _corpus(folder) -> str:
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "def", "return", "self", "value", "(", ")", ":", "\n"]
    with open(folder / "docs.jsonl", "w") as f:
        for _ in range(200):
            f.write(json.dumps({"text": " ".join(rng.choice(words, 60))}) + "\n")
    return str(folder / "docs.jsonl")


def _data(tmp_path, **overrides):
    c = base_config().data
    c.update(dict(files=_corpus(tmp_path), eval_fraction=0.2, cache_dir=str(tmp_path / "cache"), seq_len=16))
    c.update(overrides)
    return c


def _build(args: tuple) -> str:
    """One process's ensure_cache (multiprocessing target); returns the cache path and its train tokens."""
    data_json, = args
    import ml_collections

    c = ml_collections.ConfigDict(json.loads(data_json))
    path = token_cache.ensure_cache(c, get_tokenizer(c), verbose=False)
    return path + "|" + token_cache.open_split(path, "train").tokens.tobytes().hex()[:64]


def _leftovers(root: str) -> list[str]:
    return [n for n in os.listdir(os.path.join(root, "tokens")) if n.startswith(".") or "." in n]


def test_processes_building_one_cache_together_agree_and_leave_nothing(tmp_path):
    c = _data(tmp_path)
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        out = pool.map(_build, [(json.dumps(c.to_dict()),)] * 3)
    assert len(set(out)) == 1  # one cache, the same tokens for every process
    assert len(os.listdir(os.path.join(c.cache_dir, "tokens"))) == 1 and not _leftovers(c.cache_dir)


def test_the_build_needs_no_file_lock(tmp_path, monkeypatch):
    """Where flock fails (NFS without lock support: ENOLCK), the cache still builds."""
    import fcntl

    def no_lock(*_):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_lock)
    monkeypatch.setattr(fcntl, "lockf", no_lock)
    c = _data(tmp_path)
    path = token_cache.ensure_cache(c, get_tokenizer(c), verbose=False)
    assert token_cache.read_meta(path)["train"]["documents"] > 100
    assert not _leftovers(c.cache_dir)


def _no_file_locks(monkeypatch) -> None:
    """fcntl locks fail as on an NFS mount without lock support (ENOLCK)."""
    import fcntl

    def no_lock(*_):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_lock)
    monkeypatch.setattr(fcntl, "lockf", no_lock)


def test_the_sentencepiece_model_trains_without_file_locks(tmp_path, monkeypatch):
    """The SentencePiece model of local files is trained (once, under a claim) where flock fails."""
    from transformer.data import tokenizers

    _no_file_locks(monkeypatch)
    c = _data(tmp_path, tokenizer="sentencepiece", vocab_size=300)
    tok = get_tokenizer(c)
    path = tokenizers.sentencepiece_path(c)
    assert tok.vocab_size == 300 and os.path.isfile(path)
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]  # no claim, lock or temporary file left
    assert get_tokenizer(c).fingerprint == tok.fingerprint  # the second call reads the saved model


def test_the_builtin_corpus_prepares_without_file_locks(corpus_dir, monkeypatch):
    """prepare_stdlib (called for every read of the built-in corpus) takes no flock, which would fail on NFS."""
    from transformer.data import corpus

    _no_file_locks(monkeypatch)
    builder = corpus.prepare_stdlib(corpus_dir)
    assert builder.info.splits["train"].num_examples > 100


def test_a_live_claim_is_waited_for_and_a_stale_one_taken_over(tmp_path, monkeypatch):
    monkeypatch.setattr(token_cache, "_CLAIM_POLL_S", 0.05)
    c = _data(tmp_path)
    tok = get_tokenizer(c)
    path = token_cache.cache_path(c, tok)
    os.makedirs(os.path.dirname(path))
    claim = path + ".building"
    with open(claim, "w") as f:
        f.write("another process")
    done: list[str] = []
    waiter = threading.Thread(target=lambda: done.append(token_cache.ensure_cache(c, tok, verbose=False)))
    waiter.start()
    time.sleep(1.0)
    assert not done and not os.path.exists(path)  # a live claim: it waits, builds nothing
    old = time.time() - token_cache.CLAIM_STALE_S - 1
    os.utime(claim, (old, old))  # the claimant died: its claim is no longer refreshed
    waiter.join(60)
    assert done == [path] and os.path.isfile(os.path.join(path, "meta.json")) and not _leftovers(c.cache_dir)


def test_prepare_data_compares_its_rate_with_encode_batch(tmp_path):
    from test_data_files import train_hf_tokenizer

    files = _corpus(tmp_path)
    with open(files) as f:
        train_hf_tokenizer(str(tmp_path / "tokenizer.json"), [json.loads(line)["text"] for line in f])
    out = subprocess.run([sys.executable, "-m", "experiments.prepare_data", "--config=configs/lm.py",
                          f"--config.data.files={files}", f"--config.data.tokenizer={tmp_path / 'tokenizer.json'}",
                          f"--config.data.cache_dir={tmp_path / 'cache'}", "--config.data.eval_fraction=0.2",
                          "--compare_tokenizers"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    t = report["tokenize"]
    assert t["tokens"] == report["train"]["tokens"] + report["eval"]["tokens"]
    assert t["tokens_per_second"] > 0 and t["encode_batch_tokens_per_second"] > 0
    assert t["ratio"] == pytest.approx(t["tokens_per_second"] / t["encode_batch_tokens_per_second"])
    assert t["cpu_seconds"] > 0 and t["cpu_ratio"] == pytest.approx(t["encode_batch_cpu_seconds"] / t["cpu_seconds"])
