"""Process set-up for JAX: the persistent compilation cache, then `jax.distributed` where asked for."""
from __future__ import annotations

import logging
import os
from typing import Any


def setup_jax(config: Any | None = None) -> None:
    """Compilation cache under $JAX_COMPILATION_CACHE_DIR (default ~/.cache/transformer/jax, entries for
    compiles >= $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, default 1 s), then `jax.distributed` when the
    config's `distributed` section or the cluster asks."""
    import jax

    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU/GPU backend" notices
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/transformer/jax"))
    jax.config.update("jax_compilation_cache_dir", cache)
    min_seconds = float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1.0"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_seconds)
    if config is not None and "distributed" in config:
        from transformer.training import distributed
        distributed.initialize(config.distributed)
