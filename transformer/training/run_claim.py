"""One process trains a run directory at a time: DIR/run.claim, a claim file of transformer/file_claims.py.

A second `train` on a workdir that another live process is training would delete that process's in-flight
checkpoint (orbax removes unfinished saves when it opens the directory) and write a second TensorBoard event file
beside its own; it is refused instead, with one error naming the workdir and the holder. The claim is taken after
every check and before the first write to the workdir, held (a heartbeat refreshes it) until the run's summary is
written and its files closed, then released. A dead holder's claim is taken over: at once when it was a pid of
this host that no longer exists, else once it has not been refreshed for STALE_AFTER_S (its host died).

A sweep runner's own run claims (DIR/claims/RUN_ID.claim, sweeps/claims.py) are other files: a runner that holds
one and then trains the run claims DIR/runs/RUN_ID/run.claim as any train does; a group (sweep.multirun) claims
every run directory of the group. A caller whose own claim already decides who trains the run (a sweep runner
after its SLURM rule took over a requeued task's run) may pass `dead`, its rule for when the holder of the
workdir's claim is gone (file_claims.DeadRule), so a claim left by a killed task on another host need not wait
STALE_AFTER_S.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Sequence

import numpy as np
from jax.experimental import multihost_utils

from transformer import file_claims
from transformer.file_claims import DeadRule
from transformer.spec import ConfigError

__all__ = ["CLAIM", "DeadRule", "HEARTBEAT_S", "RunClaims", "STALE_AFTER_S", "claim_workdirs"]

CLAIM = "run.claim"
STALE_AFTER_S = 300.0  # a holder on another host that stopped refreshing for this long is taken to be dead
HEARTBEAT_S = 30.0


@dataclasses.dataclass
class RunClaims:
    """The claims held on a run's (or a group's) workdirs; `created`: the workdirs that claiming made."""
    claims: list[file_claims.Claim]
    created: list[str]

    def release(self, remove_created: bool = False) -> None:
        """Releases every claim; `remove_created`: also removes each workdir that claiming created, if it is
        still empty (a run refused before it wrote anything leaves no directory behind)."""
        for claim in self.claims:
            claim.release()
        self.claims = []
        if remove_created:
            for workdir in self.created:
                with contextlib.suppress(OSError):
                    os.rmdir(workdir)


def _holder(path: str) -> str:
    info = file_claims.read(path)
    if not info:
        return "another process (its claim was just released: try again)"
    who = f"pid {info['pid']} on {info['host']}" if "pid" in info and "host" in info else "an unknown process"
    return f"{who}, its claim {path} refreshed {info['age_s']:.0f} s ago"


def claim_workdirs(workdirs: Sequence[str], primary: bool, process_count: int, verbose: bool = True,
                   dead: DeadRule | None = None) -> RunClaims:
    """Process 0 claims each workdir (creating it); with several processes all learn the outcome. A workdir that
    another live process holds is a ConfigError naming it and the holder (the claims taken so far released).
    `dead`: the caller's rule for a holder that is gone (module docstring), besides file_claims' own."""
    held = RunClaims([], [])
    refused = None
    if primary:
        for workdir in workdirs:
            existed = os.path.isdir(workdir)
            path = os.path.join(workdir, CLAIM)
            claim = file_claims.try_claim(path, STALE_AFTER_S, HEARTBEAT_S, dead=dead)
            if not existed and os.path.isdir(workdir):
                held.created.append(workdir)
            if claim is None:
                refused = (workdir, _holder(path))
                break
            held.claims.append(claim)
            if claim.took_over is not None and verbose:
                print(f"{workdir}: took over the claim of a process that is gone "
                      f"(pid {claim.took_over.get('pid')} on {claim.took_over.get('host')})", flush=True)
    if process_count > 1:  # every process raises, or none
        stop = multihost_utils.broadcast_one_to_all(np.array(refused is not None, np.int32))
        if stop and refused is None:
            refused = ("a workdir of this run", "another process (process 0 was refused)")
    if refused is not None:
        held.release(remove_created=True)
        raise ConfigError(f"--workdir={refused[0]} is being trained by {refused[1]}; wait for that run to end or "
                          f"stop it (a claim whose process is gone is taken over: at once on its own host, from "
                          f"another host after {STALE_AFTER_S:.0f} s without a refresh)")
    return held
