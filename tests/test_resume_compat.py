"""Older runs resume under newer code (issue 34 §1.3): a key absent from a recorded config.json means its default
(docs/extending.md adds every option "default OFF"), and a run reads its corpus from wherever an identical copy
is (a node-local copy: the data identity compares content, not where the files are)."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from test_reliability import tiny_config
from transformer.spec import ConfigError
from transformer.training.loop import train

NEW_KEYS = {"model": ("qk_norm", "parallel_block"), "train": ("max_skipped_fraction", "grad_accum_steps"),
            "data": ("shuffle_seed",)}


def _forget(workdir: str, keys: dict[str, tuple[str, ...]]) -> None:
    """config.json as a run recorded before `keys` existed wrote it."""
    path = os.path.join(workdir, "config.json")
    with open(path) as f:
        config = json.load(f)
    for section, names in keys.items():
        for name in names:
            del config[section][name]
    with open(path, "w") as f:
        json.dump(config, f)


@pytest.fixture(scope="module")
def old_run(tmp_path_factory, corpus_dir) -> str:
    """A 4-step run of 8, stopped, its config.json rewritten without the keys added since."""
    workdir = str(tmp_path_factory.mktemp("old") / "run")
    summary = train(tiny_config(corpus_dir, steps=4, checkpoint_every=4, eval_every=4), workdir, verbose=False)
    assert summary["status"] == "ok"
    _forget(workdir, NEW_KEYS)
    return workdir


def test_a_run_recorded_before_new_keys_continues_with_them_at_their_defaults(old_run, corpus_dir, tmp_path):
    """Before: "holds a different run's config (differs in data.shuffle_seed, model.parallel_block, ...)"."""
    workdir = str(tmp_path / "run")
    shutil.copytree(old_run, workdir)
    summary = train(tiny_config(corpus_dir, steps=4, checkpoint_every=4, eval_every=4), workdir, verbose=False)
    assert summary["status"] == "ok" and summary["step"] == 4  # resumed (finished), not refused


def test_a_new_key_set_away_from_its_default_is_still_another_run(old_run, corpus_dir, tmp_path):
    workdir = str(tmp_path / "run")
    shutil.copytree(old_run, workdir)
    config = tiny_config(corpus_dir, steps=4, checkpoint_every=4, eval_every=4)
    config.model.qk_norm = True
    with pytest.raises(ConfigError, match=r"holds a different run's config \(differs in model\.qk_norm\)"):
        train(config, workdir, verbose=False)


def _text_corpus(folder: str) -> None:
    os.makedirs(folder)
    for i in range(4):
        with open(os.path.join(folder, f"part{i}.txt"), "w") as f:
            f.write(f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * 200)


@pytest.mark.slow  # CI's 15 minutes: 16 s of the default run on 2 loaded cores (2026-11-27)
def test_a_run_resumes_from_a_node_local_copy_of_its_corpus_and_not_from_other_text(corpus_dir, tmp_path):
    """The corpus copied to another folder (a node's local disk) is the same data: the run resumes there and its
    token cache is reused. A copy whose content differs is refused, naming the file."""
    shared, local = str(tmp_path / "shared"), str(tmp_path / "node-local")
    _text_corpus(shared)
    workdir, cache = str(tmp_path / "run"), str(tmp_path / "cache")

    def config(folder: str, steps: int):
        c = tiny_config(corpus_dir, steps=steps, checkpoint_every=2, eval_every=2)
        c.data.update(tfds_name="", files=os.path.join(folder, "*.txt"), eval_fraction=0.25, cache_dir=cache)
        return c

    assert train(config(shared, 2), workdir, verbose=False)["status"] == "ok"
    shutil.copytree(shared, local)
    caches = sorted(os.listdir(os.path.join(cache, "tokens")))
    summary = train(config(local, 2), workdir, verbose=False)
    assert summary["status"] == "ok" and summary["step"] == 2
    assert sorted(os.listdir(os.path.join(cache, "tokens"))) == caches  # nothing re-tokenized
    with open(os.path.join(local, "part1.txt"), "a") as f:
        f.write("another sentence.")
    with pytest.raises(ConfigError, match=r"trained on other data.*part1\.txt"):
        train(config(local, 2), workdir, verbose=False)
