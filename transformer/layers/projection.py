"""The projections of the blocks: an einsum with a multi-axis kernel (attention's q/k/v/out, the feed-forward
layer's wi/wo), an optional bias on its output axes, and an optional LoRA adapter (layers/lora.py)."""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.layers import lora
from transformer.spec import ModelConfig
from transformer.spec.lora import LoraSpec


class Projection(nn.Module):
    """An einsum with a multi-axis kernel, e.g. x_BTD · W_DNH → y_BTNH; optional bias on the output
    axes (the kernel's last axes); with `lora` (a LoraSpec of rank > 0) a low-rank adapter beside the kernel
    (layers/lora.py: lora_a, lora_b; dropout on its input unless deterministic).

    (Flax's DenseGeneral initialises a flattened kernel and reshapes it, which adds a sharding
    constraint of the wrong rank under logical-axis rules; creating the kernel in its own shape
    avoids that.)
    """
    equation: str
    shape: tuple[int, ...]
    names: tuple[str, ...]
    bias_names: tuple[str, ...] | None
    init_std: float
    dtype: Any
    param_dtype: Any
    lora: LoraSpec | None = None

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        kernel = self.param("kernel", nn.with_logical_partitioning(nn.initializers.normal(self.init_std), self.names),
                            self.shape, self.param_dtype)
        y = jnp.einsum(self.equation, x.astype(self.dtype), kernel.astype(self.dtype))
        if self.bias_names is not None:
            bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, self.bias_names),
                              self.shape[-len(self.bias_names):], self.param_dtype)  # the output axes
            y = y + bias.astype(self.dtype)
        if self.lora is not None and self.lora.rank:
            y = y + lora.adapter_delta(self, x, self.equation, self.shape, self.names, self.lora, self.dtype,
                                       self.param_dtype, deterministic)
        return y


def lora_of(cfg: ModelConfig, target: str) -> LoraSpec | None:
    """cfg.lora where projection `target` (a spec.lora.LORA_TARGETS name) is one of its targets, else None."""
    return cfg.lora if cfg.lora.rank_of(target) else None
