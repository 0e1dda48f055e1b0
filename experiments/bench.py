"""Benchmark the compiled train step: python -m experiments.bench --config=configs/lm.py:PRESET [--json].

  --config.KEY=V     any config override (model shape, data.seq_len, train.batch_size, ...)
  --steps=N          timed steps after the warm-up (median reported)
  --json             print exactly one JSON object (the Bench contract in docs/design.md)
  --compare_torch    also time a PyTorch eager GPT-2 reference (experiments/torch_gpt.py, fused AdamW) on
                     the same machine: alone (as ours), then alternating with ours round by round; the
                     ratio ours_over_torch is from the alternating rounds
  --profile_dir=DIR  after all the timed steps, trace --profile_steps (default 3) more with jax.profiler
                     into DIR, with the step's HLO text (DIR/<module>.hlo.txt), and report where their
                     device time went (experiments/profile_share.py: matmul, attention, other): `profile`

It times the same jitted, sharded, state-donating step the training loop runs (transformer/training/
steps.py) on synthetic token batches, so no data pipeline is in the measurement. MFU = tokens/s ×
flops_per_token / (peak FLOP/s × devices); the peak comes from hardware.PEAK_FLOPS by device kind or,
on CPU, from a measured float32 matmul, which uses all of the process's cores (so on CPU the peak counts
once per process, however many simulated devices share them). flops_per_token counts attention over the full
T² (spec/accounting.py's with_attention, as the loop's `flops`); mfu_causal_half counts causal self-attention
at half (with_attention_causal_half, MaxText's count), reported beside it.

Memory: memory_estimate_bytes (transformer/training/memory.py, per device) against memory_peak_bytes (the
device allocator's peak_bytes_in_use where the device keeps one, else XLA's memory analysis of the compiled
step: the same figure as peak_memory_bytes), memory_estimate_error = estimate / peak - 1.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from absl import flags
from ml_collections import config_flags

from experiments import cli
from experiments.jax_setup import setup_jax
from transformer.spec import ConfigError, MissingInputError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/lm.py:default.")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps (after 2 warm-up steps).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object only.")
_COMPARE_TORCH = flags.DEFINE_bool("compare_torch", False, "Also time a PyTorch eager GPT-2 reference.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Alternating rounds (ours, torch) with --compare_torch.")
_PROFILE_DIR = flags.DEFINE_string("profile_dir", None, "Trace --profile_steps more steps into this directory.")
_PROFILE_STEPS = flags.DEFINE_integer("profile_steps", 3, "Steps traced with --profile_dir.")


def synthetic_batch(task: Any, config: Any, vocab_size: int, sharding: Any) -> dict:
    """Random tokens in every row, one document per row, all targets counted; placed with `sharding`."""
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    out = {}
    for key, (shape, dtype) in task.batch_spec(config).items():
        if key in ("inputs", "targets"):
            value = rng.integers(0, vocab_size, size=shape)
        elif key == "positions":
            value = np.broadcast_to(np.arange(shape[-1]), shape)
        else:  # segment_ids, weights
            value = np.ones(shape)
        out[key] = jax.device_put(np.asarray(value, dtype), sharding)
    return out


def build(config: Any, devices: Any = None) -> dict:
    """The model config, the compiled train step, a fresh state and a synthetic batch (on `devices`,
    default all)."""
    import flax.linen as nn
    import jax

    from transformer.data import get_tokenizer
    from transformer.models import build_model
    from transformer.tasks import get_task
    from transformer.training import sharding, steps
    from transformer.training.resolve import model_config, run_spec
    from transformer.training.state import init_state, model_optimizer

    vocab = config.model.vocab_size or get_tokenizer(config.data).vocab_size
    model_cfg = model_config(config, vocab)
    devices = list(devices if devices is not None else jax.devices())
    run_spec(config, model_cfg, len(devices), jax.process_count())  # the training checks
    task, model = get_task(config), build_model(model_cfg)
    tx = model_optimizer(model, config.train, task.init_inputs(config))  # the loop's optimizer
    mesh, rules = sharding.make_mesh(config.mesh, devices), sharding.rules(config.mesh)
    state, shardings = init_state(model, tx, config.train.seed, task.init_inputs(config), mesh, rules)
    train_step = steps.make_train_step(model, task, tx, seed=config.train.seed,
                                       use_dropout=model_cfg.dropout_rate > 0,
                                       loss_chunk_size=config.train.get("loss_chunk_size", 0),
                                       grad_accum_steps=config.train.get("grad_accum_steps", 1))
    train_fn, _ = steps.jit_steps(train_step, steps.make_eval_step(model, task), shardings, mesh, rules)
    batch = synthetic_batch(task, config, model_cfg.vocab_size, sharding.batch_sharding(mesh, rules))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        t0 = time.perf_counter()
        compiled = train_fn.lower(state, batch).compile()
        compile_seconds = time.perf_counter() - t0
    return {"model_cfg": model_cfg, "compiled": compiled, "state": state, "batch": batch,
            "compile_seconds": compile_seconds}


def time_steps(compiled: Any, state: Any, batch: dict, n: int) -> tuple[Any, list[float]]:
    """Runs n steps, each timed to completion; returns (the new state, seconds per step)."""
    import jax

    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics["loss"])
        times.append(time.perf_counter() - t0)
    return state, times


def check_profile_dir(profile_dir: str | None, profile_steps: int) -> None:
    """Creates the trace directory before any step runs; ConfigError for one that cannot be (a file) or for
    --profile_steps < 1."""
    import os

    if not profile_dir:
        return
    if profile_steps < 1:
        raise ConfigError(f"--profile_steps={profile_steps} must be at least 1 with --profile_dir")
    if os.path.exists(profile_dir) and not os.path.isdir(profile_dir):
        raise ConfigError(f"--profile_dir={profile_dir} is a file; name a directory for the trace")
    os.makedirs(profile_dir, exist_ok=True)


def profile_steps(compiled: Any, state: Any, batch: dict, n: int, trace_dir: str) -> tuple[Any, dict]:
    """n more steps under jax.profiler.trace(trace_dir), dispatched as the loop does (blocking after the last),
    and the share of their device time per kind of kernel (experiments/profile_share.py)."""
    import jax

    from experiments import profile_share

    with jax.profiler.trace(trace_dir):
        for i in range(n):
            with jax.profiler.StepTraceAnnotation("bench", step_num=i):
                state, metrics = compiled(state, batch)
        jax.block_until_ready((state, metrics))
    profile_share.save_hlo(compiled, trace_dir)
    try:
        return state, profile_share.summarize(trace_dir)
    except MissingInputError as e:  # a trace without kernels (a GPU without CUPTI): the timings still stand
        print(f"warning: no profile share: {e}", file=sys.stderr)
        return state, {"error": str(e)}


def bench(config: Any, steps: int = 10, compare_torch: bool = False, rounds: int = 5,
          log: Any = sys.stderr, profile_dir: str | None = None, profile_count: int = 3) -> dict:
    """The Bench contract's dict (plus details); see the module docstring."""
    import jax

    from transformer.spec import flops_per_token, param_counts
    from transformer.training import hardware, memory

    check_profile_dir(profile_dir, profile_count)

    built = build(config)
    model_cfg, compiled, state, batch = built["model_cfg"], built["compiled"], built["state"], built["batch"]
    tokens_per_step = config.train.batch_size * config.data.seq_len
    state, metrics = compiled(state, batch)  # warm-up; the first step's loss is the initial model's
    initial_loss = float(metrics["loss"])
    state, _ = time_steps(compiled, state, batch, 1)
    device = jax.devices()[0]
    state, times = time_steps(compiled, state, batch, steps)  # ours alone
    out: dict[str, Any] = {"initial_loss": initial_loss}
    if compare_torch:
        from experiments import torch_gpt

        if model_cfg.positional != "learned" or model_cfg.activation not in torch_gpt.ACTIVATIONS \
                or model_cfg.norm != "layernorm" or not model_cfg.tie_embeddings \
                or model_cfg.kv_heads != model_cfg.num_heads:
            raise ConfigError("--compare_torch needs a GPT-2-shaped model (learned positions, LayerNorm, "
                             f"activation {'/'.join(torch_gpt.ACTIVATIONS)}, tied head, multi-head attention), "
                             "e.g. --config=configs/lm.py:default")
        threads = hardware.xla_cpu_threads()
        torch_step, torch_model = torch_gpt.make_step(model_cfg, config.train, config.train.batch_size,
                                                      config.data.seq_len, threads)
        torch_initial_loss = torch_step()
        torch_step()
        torch_alone = []
        for _ in range(steps):  # torch alone, as ours above
            t0 = time.perf_counter()
            torch_step()
            torch_alone.append(time.perf_counter() - t0)
        ours_s, torch_s = [], []
        per_round = max(1, steps // rounds)
        for r in range(rounds):  # alternating, so that both see the same machine state
            state, t = time_steps(compiled, state, batch, per_round)
            ours_s += t
            tt = []
            for _ in range(per_round):
                t0 = time.perf_counter()
                torch_step()
                tt.append(time.perf_counter() - t0)
            torch_s += tt
            print(f"round {r + 1}/{rounds}: ours {statistics.median(t) * 1e3:.1f} ms, "
                  f"torch {statistics.median(tt) * 1e3:.1f} ms", file=log, flush=True)
        torch_step_s = statistics.median(torch_s)
        out.update(torch_tokens_per_second=tokens_per_step / torch_step_s, torch_step_seconds=torch_step_s,
                   interleaved_tokens_per_second=tokens_per_step / statistics.median(ours_s),
                   torch_alone_tokens_per_second=tokens_per_step / statistics.median(torch_alone),
                   torch_params=sum(p.numel() for p in torch_model.parameters()),
                   torch_initial_loss=torch_initial_loss, torch_optimizer="AdamW(fused=True)",
                   torch_threads=threads, torch_version=__import__("torch").__version__)
    if profile_dir:
        state, out["profile"] = profile_steps(compiled, state, batch, profile_count, profile_dir)
        out["profile_dir"] = profile_dir
    step_s = statistics.median(times)
    tps = tokens_per_step / step_s
    per_token = flops_per_token(model_cfg, config.data.seq_len)
    fpt = per_token["training"]  # LoRA: no gradient of a frozen weight (else with_attention)
    fpt_half = per_token["with_attention_causal_half"] - (per_token["with_attention"] - fpt)
    peak = hardware.device_peak_flops(device)
    # a table peak is per device; on CPU the measured matmul used the whole process's cores, which simulated
    # devices (--xla_force_host_platform_device_count) share: one peak per process
    peak_units = jax.process_count() if device.platform == "cpu" else jax.device_count()
    mem = hardware.peak_memory(device, compiled)
    estimate = memory.estimate_from_config(config, model_cfg.vocab_size, jax.device_count())["total"]
    mfu = (lambda flops: tps * flops / (peak["flops"] * peak_units) if peak["flops"] else None)
    out = {
        "tokens_per_second": tps, "step_seconds": step_s, "step_seconds_min": min(times),
        "compile_seconds": built["compile_seconds"], "flops_per_token": fpt,
        "mfu": mfu(fpt), "mfu_causal_half": mfu(fpt_half),
        "flops_per_token_causal_half": fpt_half,
        "peak_flops": peak["flops"], "peak_flops_source": peak["source"],
        "peak_memory_bytes": mem["bytes"], "peak_memory_source": mem["source"],
        "memory_estimate_bytes": estimate, "memory_peak_bytes": mem["bytes"],
        "memory_estimate_error": estimate / mem["bytes"] - 1 if mem["bytes"] else None,
        "process_rss_bytes": hardware.process_rss_bytes(),
        "device": hardware.describe_device(device), "num_devices": jax.device_count(),
        "params": param_counts(model_cfg)["total"], "batch_size": config.train.batch_size,
        "seq_len": config.data.seq_len, "timed_steps": len(times), "compute_dtype": config.train.compute_dtype,
        "attention_impl": model_cfg.attention_impl, "remat": model_cfg.remat,
        "loss_chunk_size": config.train.get("loss_chunk_size", 0),
        "grad_accum_steps": config.train.get("grad_accum_steps", 1), **out,
    }
    if compare_torch:
        out["ours_over_torch"] = out["interleaved_tokens_per_second"] / out["torch_tokens_per_second"]
    return out


def main(argv: list[str]) -> None:
    del argv
    setup_jax(_CONFIG.value)
    check_profile_dir(_PROFILE_DIR.value, _PROFILE_STEPS.value)
    result = bench(_CONFIG.value, _STEPS.value, _COMPARE_TORCH.value, _ROUNDS.value,
                   profile_dir=_PROFILE_DIR.value, profile_count=_PROFILE_STEPS.value)
    if _JSON.value:
        print(json.dumps(result))
        return
    r = result
    print(f"device {r['device']} x{r['num_devices']}; {r['params']:,} params; batch {r['batch_size']} x "
          f"seq {r['seq_len']}; compile {r['compile_seconds']:.1f}s")
    print(f"step {r['step_seconds'] * 1e3:.1f} ms (median of {r['timed_steps']}), "
          f"{r['tokens_per_second']:,.0f} tokens/s, {r['flops_per_token'] / 1e6:.2f} MFLOP/token")
    if r["mfu"] is not None:
        print(f"MFU {r['mfu'] * 100:.1f}% of {r['peak_flops'] / 1e12:.3g} TFLOP/s ({r['peak_flops_source']})")
    if r["mfu"] is not None:
        print(f"MFU {r['mfu_causal_half'] * 100:.1f}% with causal attention counted at half")
    if r["peak_memory_bytes"] is not None:
        print(f"peak memory {r['peak_memory_bytes'] / 2**20:.1f} MiB ({r['peak_memory_source']}); estimate "
              f"{r['memory_estimate_bytes'] / 2**20:.1f} MiB ({r['memory_estimate_error'] * 100:+.1f}%)")
    if "profile" in r and "error" not in r["profile"]:
        from experiments import profile_share

        print(profile_share.format_summary(r["profile"]))
    if "ours_over_torch" in r:
        print(f"alone: ours {r['tokens_per_second']:,.0f} tokens/s, torch eager ({r['torch_threads']} threads, "
              f"{r['torch_optimizer']}) {r['torch_alone_tokens_per_second']:,.0f} tokens/s; interleaved rounds: "
              f"ours {r['interleaved_tokens_per_second']:,.0f}, torch {r['torch_tokens_per_second']:,.0f} tokens/s, "
              f"ours/torch = {r['ours_over_torch']:.2f}x")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    cli.run(main)
