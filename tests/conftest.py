"""Test-session setup: 8 simulated CPU devices, so sharding tests see a real mesh (tests/xla_env.py).

Command lines started by tests inherit TRANSFORMER_HUGE_PAGES=0: the huge-page re-exec (a second
interpreter start per CLI call) is tested on its own in tests/test_huge_pages.py, which clears it.
"""
import os

from xla_env import xla_flags

os.environ.setdefault("XLA_FLAGS", xla_flags(8))  # and LLVM at its lowest optimisation level (tests/xla_env.py)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TRANSFORMER_HUGE_PAGES", "0")
# Every compilation into the persistent cache (experiments/jax_setup.py; by default only those of 1 s or more): the
# command lines the tests start compile the same tiny steps again and again, and CI starts with an empty cache
# (measured on 2 cores: the CLI-heavy files 11% faster; the in-process tests unchanged).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pytest

# Test files of one or two tests that take about a minute or more on 2 cores (the staged sweep through SLURM, where a
# cluster runs; the fault trial's commands; the two-process resume): handed out first, so that no xdist worker ends
# the run alone on one of them. pyproject's --no-loadscope-reorder keeps this order (xdist's own puts the files with
# most tests first, these last).
SLOWEST_FIRST = ("test_slurm_sweep.py", "test_fault_trial.py", "test_multihost.py")


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the counts are of the tests that run
def pytest_collection_modifyitems(config, items) -> None:
    """Files in SLOWEST_FIRST first, then by their number of tests, most first (as xdist would order them)."""
    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    order = sorted(by_file, key=lambda f: (rank.get(os.path.basename(f), len(rank)), -len(by_file[f])))
    items[:] = [item for f in order for item in by_file[f]]


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> str:
    """A TFDS data dir holding the built-in corpus, built once per test session.

    Set TFDS_DATA_DIR to reuse a prepared corpus across sessions (CI sets a fresh one).
    """
    from ml_collections import ConfigDict

    from configs.common import base_config
    from transformer.data import load_split

    data_dir = os.environ.get("TFDS_DATA_DIR") or str(tmp_path_factory.mktemp("tfds"))
    data_cfg: ConfigDict = base_config().data
    data_cfg.data_dir = data_dir
    load_split(data_cfg, "train")  # builds on first use
    return data_dir


@pytest.fixture(scope="session")
def tiny_lm_run(tmp_path_factory, corpus_dir) -> str:
    """A 4-step gpt2_tiny run (checkpoints at steps 2 and 4), shared by the sample and attention CLI tests."""
    from configs.lm import get_config
    from transformer.training.loop import train

    config = get_config("gpt2_tiny")
    config.data.data_dir = corpus_dir
    config.data.seq_len = 32
    config.train.update(steps=4, warmup_steps=1, batch_size=8, eval_every=4, eval_steps=1, checkpoint_every=2,
                        log_every=2)
    workdir = str(tmp_path_factory.mktemp("tiny_lm_run"))
    assert train(config, workdir, verbose=False)["status"] == "ok"
    return workdir
