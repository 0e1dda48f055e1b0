"""Tokenize a config's data into the token cache ahead of training:
python -m experiments.prepare_data --config=configs/lm.py[:PRESET] [--config.data.files=GLOB ...]
python -m experiments.prepare_data --config=configs/sweeps/NAME.py [--config.base.data.KEY=V ...]

Training does the same on first use; this builds the cache once, e.g. before a sweep (every run of the
sweep then reads it, and the sweep's --dry_run can show each run's epochs). The data is local files
(`data.files`) or a TFDS dataset (`data.tfds_name`); a sweep config's data is its `base.data`. Prints the
cache's directory and its document/token/byte counts per split.
"""
from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

from experiments import cli
from experiments._paths import absolute_config

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/lm.py:gpt2_small.")


def main(argv: list[str]) -> None:
    del argv
    from transformer.data import identity, token_cache

    config = absolute_config(_CONFIG.value)
    data_cfg = config.base.data if "base" in config else config.data
    path = identity.resolve_data(data_cfg).ensure_cache()  # the settings checked as a training run checks them
    meta = token_cache.read_meta(path)
    print(json.dumps({"cache": path, **{s: {k: meta[s][k] for k in ("documents", "tokens", "bytes")}
                                        for s in token_cache.SPLITS}}))


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    cli.run(main)
