"""Several runs on one device at once: which device each of a sweep's worker processes gets, how many workers
share a GPU, and each one's share of its memory.

A worker is one process training one unit: a run, or with sweep.multirun a group of runs that differ only in
learning rate and seed, vmapped as one program (run_groups.groups). On GPUs a worker sees one GPU
(CUDA_VISIBLE_DEVICES); workers that share it allocate on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false) up to
their share of its memory (XLA_PYTHON_CLIENT_MEM_FRACTION), so no worker can take memory another one counts on.
A GPU with one worker keeps XLA's defaults. Without GPUs each worker gets an equal share of the CPU cores (XLA
sizes its thread pool from the affinity), and a unit that trains alone gets all of them.

How many workers share a GPU when the sweep chooses (--parallel=0): sweep.workers_per_device, or where that is 0
as many as fit: k with k · (MARGIN · m + PROCESS_BYTES) ≤ USABLE · M (m: the largest unit's estimate from
training/memory.py, a group's R runs counted R times; M: the GPU's memory), at most MAX_AUTO_WORKERS and one
worker per two CPU cores, and never more than the units need. A share (given --parallel=K or
sweep.workers_per_device) smaller than a unit's estimate is refused before anything trains. Why worker processes
and vmapped groups, and not groups of different widths padded to one shape: docs/sweeps.md, "Several runs on one
GPU".
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
from typing import Any, Sequence

from transformer.spec import ConfigError

USABLE = 0.9             # the share of a GPU's memory its workers take together (the rest: driver, fragmentation)
MARGIN = 1.5             # the memory estimate's error: it was 32% under the allocator's peak on an H100 (remat none)
PROCESS_BYTES = 1 << 30  # per process, outside its share: the CUDA context, cuBLAS/cuDNN handles and workspaces
MAX_AUTO_WORKERS = 8


@dataclasses.dataclass(frozen=True)
class Gpu:
    """A GPU a worker may be given: `name` as CUDA_VISIBLE_DEVICES names it (an index or a UUID); its memory in
    bytes (0: unknown)."""
    name: str
    memory_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Slot:
    """Worker slot `index`: on `gpu` (None: the CPU), one of `sharing` workers on that GPU (on the CPU: of all)."""
    index: int
    gpu: Gpu | None
    sharing: int

    @property
    def memory_fraction(self) -> float | None:
        """XLA_PYTHON_CLIENT_MEM_FRACTION for a worker sharing its GPU (None: alone on it, or on the CPU)."""
        if self.gpu is None or self.sharing <= 1:
            return None
        return share_bytes(self.gpu, self.sharing) / self.gpu.memory_bytes if self.gpu.memory_bytes \
            else USABLE / self.sharing - 0.02  # memory unknown: ~2% each for the process (1.6 GB of 80 GB)


def share_bytes(gpu: Gpu, sharing: int) -> float:
    """The memory one of `sharing` workers on `gpu` may allocate (0 when its memory is unknown)."""
    return max(USABLE * gpu.memory_bytes / sharing - PROCESS_BYTES, 0.0) if gpu.memory_bytes else 0.0


def _nvidia_smi() -> list[tuple[str, str, int]]:
    """(index, uuid, memory bytes) of every GPU nvidia-smi lists; [] without it."""
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True)
    rows = []
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            try:
                rows.append((parts[0], parts[1], int(float(parts[2]) * 2**20)))  # MiB
            except ValueError:
                rows.append((parts[0], parts[1], 0))
    return rows


def visible_gpus() -> list[Gpu]:
    """The GPUs this process may hand to workers: CUDA_VISIBLE_DEVICES's entries in their order where it is set
    (indices or UUIDs, their memory from nvidia-smi where it lists them), else every GPU nvidia-smi lists."""
    listed = _nvidia_smi()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [Gpu(index, memory) for index, _, memory in listed]
    out = []
    for name in (v.strip() for v in visible.split(",")):
        if not name:
            continue
        memory = next((m for index, uuid, m in listed if name in (index, uuid) or uuid.startswith(name)), 0)
        out.append(Gpu(name, memory))
    return out


def unit_memory(configs: Sequence[dict[str, Any]], backend: str = "gpu") -> float:
    """The estimated bytes of one unit's training step on one device (training/memory.py): its runs' configs
    (plain dicts, as in DIR/sweep.json), each counted once (a vmapped group holds R states and R batches).
    attention_impl "auto" is resolved for `backend` where the layers import; without them (a machine without
    JAX: the dry run) it stays "auto", which the estimate counts as the einsum's score buffers (an upper bound)."""
    from transformer.spec import model_spec
    from transformer.training import memory

    total = 0.0
    for c in configs:
        cfg = model_spec(c, c["model"].get("vocab_size") or 0)
        try:
            from transformer.models import resolve  # the attention registry: Flax
            cfg = resolve(cfg, backend)
        except ImportError:
            pass
        t = c["train"]
        micro = int(t["batch_size"]) // max(int(t.get("grad_accum_steps") or 1), 1)  # live activations: one micro-batch
        total += memory.estimate(cfg, batch_size=micro, seq_len=int(c["data"]["seq_len"]),
                                 loss_chunk_size=int(t.get("loss_chunk_size") or 0))["total"]
    return total


def auto_workers(unit_bytes: float, gpu: Gpu, cap: int) -> int:
    """How many workers fit on `gpu` when each may need `unit_bytes` (the largest unit's estimate): the largest
    k ≤ cap with k · (MARGIN · unit_bytes + PROCESS_BYTES) ≤ USABLE · memory; 1 when its memory is unknown."""
    if not gpu.memory_bytes:
        return 1
    return max(1, min(cap, int(USABLE * gpu.memory_bytes // (MARGIN * unit_bytes + PROCESS_BYTES))))


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def place(parallel: int, gpus: Sequence[Gpu], units_bytes: Sequence[float], workers_per_device: int = 0,
          cores: int | None = None) -> list[Slot]:
    """The worker slots for units of the estimated sizes `units_bytes` (unit_memory), in the order the runner
    fills them. parallel K > 0: K workers, on GPUs slot s on GPU s mod G; parallel 0 (the sweep chooses): on GPUs
    `workers_per_device` each (0: auto_workers, at most MAX_AUTO_WORKERS and `cores` / 2), never more than the
    units need, slots alternating between GPUs; without GPUs one slot (the runner trains in its own process).
    A GPU's share smaller than the largest unit's estimate (K or workers_per_device given) is a ConfigError."""
    cores = cores or len(os.sched_getaffinity(0))
    n_units, largest = max(len(units_bytes), 1), max(units_bytes, default=0.0)
    if not gpus:
        return [Slot(i, None, max(parallel, 1)) for i in range(max(parallel, 1))]
    if parallel > 0:
        on = [gpus[s % len(gpus)] for s in range(parallel)]
        per = {g: on.count(g) for g in on}
        _check_share(per, largest, f"--parallel={parallel}", parallel=True)
        return [Slot(s, g, per[g]) for s, g in enumerate(on)]
    cap = min(MAX_AUTO_WORKERS, max(1, cores // 2))
    k = {g: workers_per_device or auto_workers(largest, g, cap) for g in gpus}
    if workers_per_device:
        _check_share(k, largest, f"sweep.workers_per_device={workers_per_device}", parallel=False)
    need = math.ceil(n_units / len(gpus))
    k = {g: max(1, min(n, need)) for g, n in k.items()}
    order = sorted((j, gi) for gi, g in enumerate(gpus) for j in range(k[g]))  # GPU 0, 1, ..., then the 2nd on each
    return [Slot(i, gpus[gi], k[gpus[gi]]) for i, (_, gi) in enumerate(order)]


def _check_share(per_gpu: dict[Gpu, int], largest: float, setting: str, parallel: bool) -> None:
    for gpu, n in per_gpu.items():
        share = share_bytes(gpu, n)
        if n > 1 and gpu.memory_bytes and share < largest:
            fits = auto_workers(largest, gpu, MAX_AUTO_WORKERS)
            raise ConfigError(
                f"{setting} puts {n} workers on GPU {gpu.name} ({_gib(gpu.memory_bytes)}): each may use "
                f"{_gib(share)}, but the largest run (or group) needs an estimated {_gib(largest)} "
                f"(transformer/training/memory.py); use {'--parallel=0' if parallel else 'sweep.workers_per_device=0'} "
                f"(the sweep chooses: {fits} per GPU of this size) or fewer workers")


def describe(slots: Sequence[Slot]) -> str:
    """'4 workers on GPU 0 (each up to 0.213 of its memory)', or on the CPU '2 workers'."""
    gpus = list(dict.fromkeys(s.gpu for s in slots if s.gpu is not None))
    if not gpus:
        return f"{len(slots)} worker{'s' * (len(slots) != 1)}"
    first = [next(s for s in slots if s.gpu == g) for g in gpus]
    return "; ".join(f"{s.sharing} worker{'s' * (s.sharing != 1)} on GPU {s.gpu.name}"
                     + (f" (each up to {s.memory_fraction:.3f} of its memory)" if s.memory_fraction else "")
                     for s in first)


def devices(slots: Sequence[Slot]) -> int:
    """The devices the slots' workers share: their GPUs, or on the CPU one per worker (each its own cores)."""
    return len({s.gpu for s in slots}) if slots and slots[0].gpu is not None else len(slots)


def worker_env(slot: Slot, alone: bool = False,
               environ: dict[str, str] | None = None) -> tuple[dict[str, str], list[int] | None]:
    """(environment, CPU affinity) of the worker in `slot`: on a GPU, that GPU, and where it shares it, memory
    on demand up to its share; on the CPU an equal share of the cores, or all of them when the unit trains
    `alone` (nothing else running or ready)."""
    env = dict(os.environ if environ is None else environ)
    if slot.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = slot.gpu.name
        if slot.sharing > 1:
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{slot.memory_fraction:.3f}"
        return env, None
    cpus = sorted(os.sched_getaffinity(0))
    if alone or slot.sharing > len(cpus):
        return env, None
    share = len(cpus) // slot.sharing
    mine = cpus[slot.index * share:(slot.index + 1) * share]
    env["OMP_NUM_THREADS"] = str(len(mine))
    return env, mine


def out_of_memory(row: dict[str, Any] | None) -> bool:
    """Whether a results row failed for want of device memory (XLA's RESOURCE_EXHAUSTED)."""
    error = str((row or {}).get("error") or "")
    return (row or {}).get("status") == "failed" and ("RESOURCE_EXHAUSTED" in error or "out of memory" in error.lower())
