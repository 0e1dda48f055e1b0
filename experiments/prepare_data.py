"""Tokenize a config's local files into the token cache ahead of training:
python -m experiments.prepare_data --config=configs/lm.py[:PRESET] [--config.data.files=GLOB ...]

Training does the same on first use; this builds the cache once, e.g. before a sweep (every run of
the sweep then reads it). Prints the cache's directory and its document/token/byte counts.
"""
from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

from experiments import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/lm.py:gpt2_small.")


def main(argv: list[str]) -> None:
    del argv
    from transformer.data import documents, get_tokenizer, token_cache
    from transformer.config import ConfigError

    data_cfg = _CONFIG.value.data
    if not documents.uses_files(data_cfg):
        raise ConfigError("data.files is empty: prepare_data tokenizes local files (TFDS datasets are read "
                          "directly); set --config.data.files=GLOB")
    path = token_cache.ensure_cache(data_cfg, get_tokenizer(data_cfg))
    meta = token_cache.read_meta(path)
    print(json.dumps({"cache": path, **{s: {k: meta[s][k] for k in ("documents", "tokens", "bytes")}
                                        for s in token_cache.SPLITS}}))


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    cli.run(main)
