"""What every command-line entry point shares: JAX set-up and user-facing error handling."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

from absl import app, logging as absl_logging

from transformer.models.config import ConfigError


def setup_jax(config: Any | None = None) -> None:
    """Persistent compilation cache, then `jax.distributed` when the config or cluster asks for it."""
    import logging

    import jax

    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU/GPU backend" notices
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/transformer/jax"))
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    if config is not None and "distributed" in config:
        from transformer.training import distributed
        distributed.initialize(config.distributed)


def run(main: Callable[[list[str]], None]) -> None:
    """absl's app.run, but a user's mistake (bad config, bad file) prints one line and exits 2."""

    def guarded(argv: list[str]) -> None:
        try:
            main(argv)
        except (ConfigError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2)

    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax/grain INFO lines would drown the progress
    app.run(guarded)
