"""Test-session setup: 8 simulated CPU devices, so sharding tests see a real mesh."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest


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
