"""Train a model: python -m experiments.train --config=configs/lm.py[:PRESET] --workdir=DIR [--config.KEY=V].

Rerunning the same command on the same DIR resumes from its latest checkpoint.
"""
from __future__ import annotations

import sys

from absl import flags
from ml_collections import config_flags

from experiments import cli
from experiments.jax_setup import setup_jax

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/lm.py:llama_tiny.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: config, metrics, checkpoints, summary.")


def main(argv: list[str]) -> None:
    del argv
    setup_jax(_CONFIG.value)
    from transformer.training.loop import train  # after JAX's distributed/compilation-cache set-up
    try:
        summary = train(_CONFIG.value, _WORKDIR.value)
    except FloatingPointError as e:  # train.nonfinite="stop": the diagnosis, without a traceback
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    if summary["status"] != "ok":
        raise SystemExit(3 if summary["status"] == "preempted" else 1)


if __name__ == "__main__":
    flags.mark_flags_as_required(["config", "workdir"])
    cli.run(main)
