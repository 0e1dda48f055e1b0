"""Multi-host start-up through JAX's own distributed runtime (`jax.distributed`)."""
from __future__ import annotations

import os
from typing import Any

import jax

from transformer.spec import ConfigError


def cluster_environment() -> str | None:
    """The scheduler JAX can read the process layout from, if this looks like a multi-process job."""
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return "slurm"
    if os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") > 0 or os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "tpu"
    if os.environ.get("OMPI_COMM_WORLD_SIZE", "1") != "1":
        return "mpi"
    return None


def initialize(dist_cfg: Any) -> None:
    """Calls `jax.distributed.initialize` when the config or the cluster's environment asks for it.

    Explicit: `distributed.coordinator_address` + `num_processes` + `process_id`. Otherwise, under
    SLURM, a TPU pod or Open MPI, JAX reads the layout from the environment. A single process needs
    nothing. Must run before JAX touches any device.
    """
    if dist_cfg.num_processes and dist_cfg.num_processes > 1:
        if not dist_cfg.coordinator_address:
            raise ConfigError("distributed.num_processes > 1 needs distributed.coordinator_address (HOST:PORT)")
        if not 0 <= dist_cfg.process_id < dist_cfg.num_processes:
            raise ConfigError(f"distributed.process_id={dist_cfg.process_id} must be in "
                              f"[0, {dist_cfg.num_processes}) for distributed.num_processes={dist_cfg.num_processes}")
        jax.distributed.initialize(coordinator_address=dist_cfg.coordinator_address,
                                   num_processes=dist_cfg.num_processes, process_id=dist_cfg.process_id)
    elif cluster_environment() is not None:
        jax.distributed.initialize()
