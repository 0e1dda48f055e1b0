"""Whether the SLURM tests can run here: `sbatch` on PATH and a controller that answers.

A machine with the SLURM client installed but no reachable controller ("Unable to contact slurm controller")
skips them with that reason, as a machine without SLURM does, instead of failing after minutes of retries.
As root, `bash .ci/slurm_localhost.sh` starts a one-node cluster on localhost (CI does)."""
from __future__ import annotations

import functools
import shutil
import subprocess

import pytest

ANSWER_TIMEOUT_S = 10.0


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why the SLURM tests cannot run here, or None when they can."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return ("no SLURM here (`sbatch` is not on PATH); as root, bash .ci/slurm_localhost.sh starts a one-node "
                "cluster on localhost")
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=ANSWER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"the SLURM controller did not answer `sinfo` within {ANSWER_TIMEOUT_S:.0f} s"
    if done.returncode != 0:
        return f"the SLURM client is installed but no controller answers (`sinfo`: {done.stderr.strip()[:200]})"
    return None


def skip_without_cluster() -> pytest.MarkDecorator:
    """The skip mark of the SLURM tests (checked once per test session)."""
    return pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")
