"""Benchmark the compiled train step: python -m experiments.bench --config=configs/lm.py:PRESET [--json].

  --config.KEY=V     any config override (model shape, data.seq_len, train.batch_size, ...)
  --steps=N          timed steps after the warm-up (median reported)
  --json             print exactly one JSON object (the Bench contract in docs/design.md)
  --compare_torch    also time a PyTorch eager GPT-2 reference (experiments/torch_gpt.py, fused AdamW) on
                     the same machine: alone (as ours), then alternating with ours round by round; the
                     ratio ours_over_torch is from the alternating rounds

It times the same jitted, sharded, state-donating step the training loop runs (transformer/training/
steps.py) on synthetic token batches, so no data pipeline is in the measurement. MFU = tokens/s ×
flops_per_token / (peak FLOP/s × devices); the peak comes from hardware.PEAK_FLOPS by device kind or,
on CPU, from a measured float32 matmul, which uses all of the process's cores (so on CPU the peak counts
once per process, however many simulated devices share them).
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
from transformer.spec import ConfigError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/lm.py:default.")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps (after 2 warm-up steps).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object only.")
_COMPARE_TORCH = flags.DEFINE_bool("compare_torch", False, "Also time a PyTorch eager GPT-2 reference.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Alternating rounds (ours, torch) with --compare_torch.")


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


def bench(config: Any, steps: int = 10, compare_torch: bool = False, rounds: int = 5,
          log: Any = sys.stderr) -> dict:
    """The Bench contract's dict (plus details); see the module docstring."""
    import jax

    from transformer.spec import flops_per_token, param_counts
    from transformer.training import hardware

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
    step_s = statistics.median(times)
    tps = tokens_per_step / step_s
    fpt = flops_per_token(model_cfg, config.data.seq_len)["training"]  # LoRA: no gradient of a frozen weight
    peak = hardware.device_peak_flops(device)
    # a table peak is per device; on CPU the measured matmul used the whole process's cores, which simulated
    # devices (--xla_force_host_platform_device_count) share: one peak per process
    peak_units = jax.process_count() if device.platform == "cpu" else jax.device_count()
    mem = hardware.peak_memory(device, compiled)
    out = {
        "tokens_per_second": tps, "step_seconds": step_s, "step_seconds_min": min(times),
        "compile_seconds": built["compile_seconds"], "flops_per_token": fpt,
        "mfu": tps * fpt / (peak["flops"] * peak_units) if peak["flops"] else None,
        "peak_flops": peak["flops"], "peak_flops_source": peak["source"],
        "peak_memory_bytes": mem["bytes"], "peak_memory_source": mem["source"],
        "process_rss_bytes": hardware.process_rss_bytes(),
        "device": hardware.describe_device(device), "num_devices": jax.device_count(),
        "params": param_counts(model_cfg)["total"], "batch_size": config.train.batch_size,
        "seq_len": config.data.seq_len, "timed_steps": len(times), "compute_dtype": config.train.compute_dtype,
        "attention_impl": model_cfg.attention_impl, "remat": model_cfg.remat,
        "loss_chunk_size": config.train.get("loss_chunk_size", 0), **out,
    }
    if compare_torch:
        out["ours_over_torch"] = out["interleaved_tokens_per_second"] / out["torch_tokens_per_second"]
    return out


def main(argv: list[str]) -> None:
    del argv
    setup_jax(_CONFIG.value)
    result = bench(_CONFIG.value, _STEPS.value, _COMPARE_TORCH.value, _ROUNDS.value)
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
    if r["peak_memory_bytes"] is not None:
        print(f"peak memory {r['peak_memory_bytes'] / 2**20:.1f} MiB ({r['peak_memory_source']})")
    if "ours_over_torch" in r:
        print(f"alone: ours {r['tokens_per_second']:,.0f} tokens/s, torch eager ({r['torch_threads']} threads, "
              f"{r['torch_optimizer']}) {r['torch_alone_tokens_per_second']:,.0f} tokens/s; interleaved rounds: "
              f"ours {r['interleaved_tokens_per_second']:,.0f}, torch {r['torch_tokens_per_second']:,.0f} tokens/s, "
              f"ours/torch = {r['ours_over_torch']:.2f}x")


if __name__ == "__main__":
    flags.mark_flags_as_required(["config"])
    cli.run(main)
