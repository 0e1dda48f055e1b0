"""Runs per hour of small runs trained one at a time, or several at once on one device (docs/sweeps.md, "Several
runs on one GPU"): python -m experiments.bench_pack [--scale=device|cpu] [--modes=one,workers,groups]
[--workers=0] [--out=DIR] [--deadline_s=S]

The runs are this file's sweep (`get_config`, also a sweep config: --config=experiments/bench_pack.py:SCALE): one
IsoFLOP budget of LLaMA-shaped models (RoPE, RMSNorm, SwiGLU) with an 8k vocabulary's embeddings and head, 4 widths
and 2 more seeds at the 2 middle ones (6 runs; sweep.multirun makes 4 units of them), bf16 on the device scale — the
shape of a small budget of an IsoFLOP sweep on one GPU. Each mode is the sweep command on a fresh directory with a
cold compilation cache (compiling is part of a small run's cost):
  one      --parallel=1: one run after another in one process (what a sweep did before)
  workers  --parallel=0: as many worker processes on the GPU as the memory estimates allow (`--workers=K`: K)
  groups   the same with sweep.multirun: runs that differ only in seed train as one vmapped program
Prints one JSON object: per mode the wall time to the last run's row, runs per hour and the speedup over `one`;
each run's losses against `one` (eval loss relative difference, train-loss curve, bitwise equal or not) and
whether they are within TOLERANCE; and the sweep.estimate_* values these times calibrate (`calibration`).
The data (the built-in corpus, byte tokens) is prepared before any mode is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.abspath(__file__)
# Each run's final eval loss packed against the same run trained alone, relative (docs/sweeps.md):
# - workers: the same program in another process. On the CPU in float32 7 of 8 runs were bitwise equal and one 1.4e-6
#   apart (a reduction split over another number of cores). On a GPU in bf16 the program is the same too; what may
#   differ is a kernel that autotuning picks under contention and the order of atomic adds (the embedding gradient),
#   each a rounding of 2^-9 relative per step, which training amplifies: half the 2% this repository allows bf16
#   runs of two attention algorithms (tests/test_gpu.py).
# - groups: another program (vmapped, batched matmuls). Adam amplifies its float32 rounding at high learning rates
#   (0.35% at lr 0.019 on the CPU; 2% between one and two devices for a run alone: BENCHMARKS.md); in bf16 the same
#   bound as those two attention algorithms.
TOLERANCE = {"workers": {"float32": 1e-5, "bfloat16": 1e-2}, "groups": {"float32": 2e-2, "bfloat16": 2e-2}}
SCALES = {
    # width, depth, heads' dim, vocabulary, seq, batch, the budget (FLOPs), dtype
    "device": dict(d_models=(128, 192, 256, 320), num_layers=4, head_dim=64, vocab=8192, seq_len=512,
                   batch_size=32, budget=1.5e14, dtype="bfloat16", flops_per_second=0.4 * 989e12,
                   step_overhead_s=0.004, run_overhead_s=20.0),
    "cpu": dict(d_models=(16, 24, 32, 40), num_layers=2, head_dim=8, vocab=0, seq_len=32, batch_size=8,
                budget=1e10, dtype="float32", flops_per_second=2.5e10, step_overhead_s=0.004, run_overhead_s=6.0),
}


def get_config(scale: str = "device") -> Any:
    """The bench's runs as a sweep config (see the module docstring)."""
    from configs import lm
    from configs.sweeps import common

    p = SCALES[scale or "device"]
    base = lm.get_config("llama_tiny")
    base.data.tokenizer = "bytes"
    base.data.seq_len = p["seq_len"]
    base.model.vocab_size = p["vocab"]  # 8192: an 8k tokenizer's embedding and head cost (the bytes use 259 ids)
    base.model.num_kv_heads = 0
    base.train.update(batch_size=p["batch_size"], compute_dtype=p["dtype"], eval_steps=4, b2=0.99)
    return common.make(dict(
        name=f"bench_pack_{scale}", budgets=(p["budget"],), d_models=p["d_models"], num_layers=p["num_layers"],
        head_dim=p["head_dim"], ffn_ratio=8.0 / 3.0, ffn_multiple=8 if scale == "cpu" else 64, sizes_per_budget=4,
        size_span=4.0, prior_tokens_per_param=2.0, lr_coefficient=0.25, lr_exponent=-0.3, lr_max=3e-3,
        min_steps=20, seeds=dict(extra=1, sizes=2), evals_per_run=1, checkpoints_per_run=1, logs_per_run=10,
        fit_bootstrap=0, estimate_flops_per_second=p["flops_per_second"],
        estimate_step_overhead_s=p["step_overhead_s"], estimate_run_overhead_s=p["run_overhead_s"]), base)


MODES = {"one": ["--parallel=1"], "workers": ["--parallel={workers}"],
         "groups": ["--parallel={workers}", "--config.sweep.multirun=True"]}


def _rows(workdir: str) -> dict[str, dict]:
    path = os.path.join(workdir, "results.jsonl")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["run_id"]: r for r in map(json.loads, filter(str.strip, f))}


def _train_losses(workdir: str, run_id: str) -> dict[int, float]:
    path = os.path.join(workdir, "runs", run_id, "metrics.jsonl")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["step"]: r["train_loss"] for r in map(json.loads, filter(str.strip, f)) if "train_loss" in r}


def run_mode(name: str, scale: str, root: str, workers: int, timeout: float) -> dict[str, Any]:
    """The sweep command of mode `name` in root/name with its own cold compilation cache; its times and rows."""
    workdir = os.path.join(root, name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.join(root, f"jaxcache_{name}"), PYTHONUNBUFFERED="1")
    shutil.rmtree(env["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    cmd = [sys.executable, "-m", "experiments.sweep", f"--config={CONFIG}:{scale}", f"--workdir={workdir}",
           *(a.format(workers=workers) for a in MODES[name])]
    t0 = time.time()
    with open(os.path.join(root, f"{name}.log"), "w") as log:
        try:
            code = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    rows = _rows(workdir)
    path = os.path.join(workdir, "results.jsonl")
    wall = os.path.getmtime(path) - t0 if rows else None  # to the last row: the fit after it is not timed
    workers_line = next((ln for ln in open(os.path.join(root, f"{name}.log")) if "runs to go in" in ln), "")
    ok = [r for r in rows.values() if r.get("status") == "ok"]
    return {"command": " ".join(cmd[1:]), "exit": code, "runs": len(rows), "ok": len(ok), "wall_seconds": wall,
            "runs_per_hour": len(rows) * 3600.0 / wall if wall else None,
            "workers": _workers(workers_line),
            "compile_seconds": sum(r.get("compile_seconds") or 0 for r in ok),
            "run_seconds": sum(r.get("wall_seconds") or 0 for r in ok), "workdir": workdir}


def _workers(line: str) -> str | None:
    """What the runner's first line says of its workers: '6 workers on GPU 0 (each up to ...)', or this process."""
    if " runs to go in " not in line:
        return None
    tail = line.split(" runs to go in ", 1)[1].strip().split(", ", 1)
    return tail[1] if len(tail) > 1 else "one process"


def compare(root: str, name: str, dtype: str) -> dict[str, Any]:
    """Each run of mode `name` against the same run in mode `one`: eval loss relative difference, the train-loss
    curve's largest relative difference, whether every logged loss is bitwise equal; within TOLERANCE[name][dtype]."""
    a_dir, b_dir = os.path.join(root, "one"), os.path.join(root, name)
    alone, packed = _rows(a_dir), _rows(b_dir)
    per_run = {}
    for rid, row in packed.items():
        if rid not in alone or alone[rid].get("eval_loss") is None or row.get("eval_loss") is None:
            continue
        la, lb = _train_losses(a_dir, rid), _train_losses(b_dir, rid)
        steps = sorted(set(la) & set(lb))
        per_run[rid] = {
            "eval_loss": [alone[rid]["eval_loss"], row["eval_loss"]],
            "eval_rel_diff": abs(row["eval_loss"] - alone[rid]["eval_loss"]) / abs(alone[rid]["eval_loss"]),
            "train_max_rel_diff": max((abs(lb[s] - la[s]) / abs(la[s]) for s in steps), default=None),
            "bitwise_equal": bool(steps) and all(la[s] == lb[s] for s in steps)
                             and row["eval_loss"] == alone[rid]["eval_loss"]}
    worst = max((v["eval_rel_diff"] for v in per_run.values()), default=None)
    tolerance = TOLERANCE[name][dtype]
    return {"runs": per_run, "max_eval_rel_diff": worst, "tolerance": tolerance,
            "within": worst is not None and worst <= tolerance and len(per_run) == len(alone),
            "bitwise_equal_runs": sum(v["bitwise_equal"] for v in per_run.values())}


def calibrate(root: str, settings: dict[str, Any], modes: dict[str, dict]) -> dict[str, Any]:
    """The sweep.estimate_* values these times imply (transformer/design/plan.py): with the config's FLOP/s, the
    step and run overheads least-squares from the runs trained one at a time (t = n·(c + s) + o), and the pack
    overlap from the workers' wall time where the device's time bounds it (T = Σ n·(c + (1 − ω)·s))."""
    import numpy as np

    rows = [r for r in _rows(os.path.join(root, "one")).values() if r.get("status") == "ok"]
    if len(rows) < 2:
        return {}
    F = settings["estimate_flops_per_second"]
    n = np.array([r["steps"] for r in rows], float)
    c = np.array([r["batch_size"] * r["seq_len"] * r["flops_per_token"] / F for r in rows])
    t = np.array([r["wall_seconds"] for r in rows], float)
    (s, o), *_ = np.linalg.lstsq(np.stack([n, np.ones_like(n)], 1), t - n * c, rcond=None)
    s, o = max(float(s), 0.0), max(float(o), 0.0)
    out: dict[str, Any] = {"estimate_flops_per_second": F, "estimate_step_overhead_s": s,
                           "estimate_run_overhead_s": o}
    wall = (modes.get("workers") or {}).get("wall_seconds")
    if wall and s > 0:
        overlap = 1.0 - (wall - float(np.sum(n * c))) / (s * float(np.sum(n)))
        out["estimate_pack_overlap"] = min(max(overlap, 0.0), 1.0)
        out["pack_overlap_note"] = ("from the workers' wall time as if the device bounded it; where the workers' "
                                    "own time bounds it this is a lower bound")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="device", choices=sorted(SCALES))
    ap.add_argument("--modes", default="one,workers,groups")
    ap.add_argument("--workers", type=int, default=0, help="--parallel of the packed modes (0: the sweep chooses)")
    ap.add_argument("--out", default="/tmp/bench_pack")
    ap.add_argument("--deadline_s", type=float, default=0.0, help="> 0: skip a mode that would start after this")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        sys.exit(f"error: --modes={args.modes} must name modes among {', '.join(MODES)}")
    start = time.time()
    os.makedirs(args.out, exist_ok=True)
    prep = subprocess.run([sys.executable, "-m", "experiments.prepare_data", f"--config={CONFIG}:{args.scale}"],
                          cwd=REPO, capture_output=True, text=True)
    if prep.returncode:
        sys.exit(f"error: preparing the data failed:\n{prep.stderr[-3000:]}")
    from transformer.design.spec import SweepSpec
    spec = SweepSpec.of(get_config(args.scale))
    out: dict[str, Any] = {"scale": args.scale, "dtype": spec.base["train"]["compute_dtype"],
                           "device": _device(), "modes": {}, "skipped": []}
    for name in modes:
        elapsed = time.time() - start
        if args.deadline_s and elapsed > args.deadline_s:
            out["skipped"].append(name)
            continue
        left = args.deadline_s - elapsed if args.deadline_s else 3600.0
        out["modes"][name] = run_mode(name, args.scale, args.out, args.workers, max(left, 30.0))
        print(f"{name}: {json.dumps(out['modes'][name])}", file=sys.stderr, flush=True)
    one = out["modes"].get("one", {}).get("runs_per_hour")
    for name, m in out["modes"].items():
        if name != "one" and one and m.get("runs_per_hour"):
            m["speedup"] = m["runs_per_hour"] / one
            m["losses"] = compare(args.out, name, out["dtype"])
    out["calibration"] = calibrate(args.out, spec.settings(), out["modes"])
    print(json.dumps(out, indent=1))


def _device() -> str:
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True)
        if q.returncode == 0 and q.stdout.strip():
            return q.stdout.strip().splitlines()[0]
    return f"CPU ({os.cpu_count()} cores, {len(os.sched_getaffinity(0))} usable)"


if __name__ == "__main__":
    main()
