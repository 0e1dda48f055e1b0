"""Checks of a whole training config, run before any data is read or anything is compiled.

Each failure raises ConfigError naming the setting and what would be valid.
"""
from __future__ import annotations

from typing import Any

from transformer.config import ConfigError, ModelConfig
from transformer.models import resolve
from transformer.training import optimizer, profiler, sharding, wandb_run


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive integer")


VOCAB_MULTIPLE = 128


def padded_vocab_size(vocab_size: int) -> int:
    """The tokenizer's vocabulary rounded up to a multiple of 128, so the embedding and head split evenly
    over any power-of-two tensor axis and map well onto matmul units (as nanoGPT and MaxText do)."""
    return -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def model_config(config: Any, vocab_size: int) -> ModelConfig:
    """The validated ModelConfig: when model.vocab_size is 0, the tokenizer's vocabulary padded to a
    multiple of 128 (an explicit size is used as is); the compute dtype from train.compute_dtype (its one
    setting); registry names checked and attention_impl="auto" resolved for this platform."""
    d = config.model.to_dict()
    if not d.get("vocab_size"):
        d["vocab_size"] = padded_vocab_size(vocab_size)
    elif d["vocab_size"] < vocab_size:
        raise ConfigError(f"model.vocab_size={d['vocab_size']} is smaller than the tokenizer's vocabulary "
                          f"({vocab_size}); use 0 (take the tokenizer's) or at least {vocab_size}")
    return resolve(ModelConfig.from_dict(d, dtype=config.train.compute_dtype))


def check_training(config: Any, model_cfg: ModelConfig, num_devices: int, process_count: int) -> tuple[int, ...]:
    """Checks train/data/mesh settings against the model and the devices; returns the mesh shape."""
    t = config.train
    for name in ("steps", "batch_size", "log_every", "eval_every", "eval_steps", "checkpoint_every",
                 "keep_checkpoints"):
        _positive_int(f"train.{name}", t[name])
    _positive_int("data.seq_len", config.data.seq_len)
    optimizer.make_optimizer(t)  # validates schedule, learning rate, warm-up, clipping, nonfinite policy
    profiler.window(config)  # logging.profile_*
    wandb_run.check(config)  # logging.wandb*: the package installed, a valid mode
    shape = sharding.mesh_shape(config.mesh, num_devices)
    rules = dict(sharding.rules(config.mesh))
    batch_axes = rules.get("batch") or ()
    batch_axes = (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
    dp = 1
    for axis in batch_axes:
        dp *= shape[sharding.MESH_AXES.index(axis)]
    if t.batch_size % dp:
        raise ConfigError(f"train.batch_size={t.batch_size} must be divisible by the data-parallel size {dp} "
                          f"(mesh axes {batch_axes} of mesh {dict(zip(sharding.MESH_AXES, shape))})")
    if t.batch_size % process_count:
        raise ConfigError(f"train.batch_size={t.batch_size} must be divisible by the number of processes "
                          f"({process_count})")
    if model_cfg.positional != "none" and config.data.seq_len > model_cfg.max_len:
        what = ("the position table" if model_cfg.positional in ("learned", "sinusoidal") else
                "the context length the model declares, e.g. max_position_embeddings on export")
        raise ConfigError(f"data.seq_len={config.data.seq_len} exceeds model.max_len={model_cfg.max_len} "
                          f"({what}, positional={model_cfg.positional!r}); raise model.max_len or lower seq_len")
    # Each dimension is split by its own parameter rule (heads, kv_heads, mlp, vocab: configs/common.py).
    for name, size, rule in (("model.num_heads", model_cfg.num_heads, "heads"),
                             ("model.num_kv_heads", model_cfg.kv_heads, "kv_heads"),
                             ("model.d_ff", model_cfg.d_ff, "mlp")):
        axes = rules.get(rule) or ()
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        ways = 1
        for axis in axes:
            ways *= shape[sharding.MESH_AXES.index(axis)]
        if size % ways:
            raise ConfigError(f"{name}={size} must be divisible by {ways}, the size of mesh axes {axes} that "
                              f"mesh.rules maps '{rule}' to (mesh {dict(zip(sharding.MESH_AXES, shape))})")
    return shape
