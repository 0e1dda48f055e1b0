"""LoRA adapters (Hu et al. 2021) inside a projection, and which parameters a LoRA run trains.

Legend: r rank, s = alpha / r (spec/lora.py), "in"/"out" the kernel's input and output axes.

A projection y = einsum(x, W) with W of shape (in..., out...) (attention's query (D, N, H), out (N, H, D); a
feed-forward kernel (D, F)) gets two parameters beside its kernel, in the same module:
  lora_a  (in..., r)   logical names: the kernel's input names + "lora_rank"; init uniform, variance 1/(3·fan_in)
                       (peft's kaiming_uniform(a=√5))
  lora_b  (r, out...)  "lora_rank" + the kernel's output names; init zero, so a fresh adapter changes nothing
and y += s · einsum(einsum(dropout(x), A), B). `merged_kernel` folds it into W (W + s·A·B, the same function).

Under LoRA a run trains only the adapters and spec.lora.TRAINED_MODULES (`is_trained`); optimizer.py masks the
rest out of AdamW (no state for it) and steps.py stops its gradient (no weight gradient is computed for it).
"""
from __future__ import annotations

import string
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.spec import ModelConfig
from transformer.spec.lora import ADAPTER_NAMES, TRAINED_MODULES, LoraSpec

# Logical name of the rank axis: in no mesh rule (configs/common.py), so replicated, as the stacked "layers" axis.
RANK_AXIS = "lora_rank"


def split_equation(equation: str) -> tuple[str, str, str, int]:
    """("btd,dnh->btnh") -> (x letters, kernel letters, output letters, number of the kernel's input axes)."""
    lhs, out = equation.replace(" ", "").split("->")
    x, kernel = lhs.split(",")
    n_in = 0
    while n_in < len(kernel) and kernel[n_in] in x:
        n_in += 1
    return x, kernel, out, n_in


def adapter_delta(module: nn.Module, x: jax.Array, equation: str, shape: tuple[int, ...], names: tuple[str, ...],
                  spec: LoraSpec, dtype: Any, param_dtype: Any, deterministic: bool) -> jax.Array:
    """s · (dropout(x) A) B for the projection `equation` with a kernel of `shape` and logical `names`, its two
    parameters created in `module`'s scope (call from its compact method). Returns the output's shape."""
    x_spec, k_spec, out_spec, n_in = split_equation(equation)
    r = next(c for c in string.ascii_lowercase if c not in x_spec + k_spec + out_spec)
    in_axes = tuple(range(n_in))
    a_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform", in_axis=in_axes, out_axis=-1)
    a = module.param("lora_a", nn.with_logical_partitioning(a_init, (*names[:n_in], RANK_AXIS)),
                     (*shape[:n_in], spec.rank), param_dtype)
    b = module.param("lora_b", nn.with_logical_partitioning(nn.initializers.zeros, (RANK_AXIS, *names[n_in:])),
                     (spec.rank, *shape[n_in:]), param_dtype)
    if spec.dropout and not deterministic:
        x = nn.Dropout(spec.dropout, name="lora_dropout")(x, deterministic=False)
    batch = "".join(c for c in x_spec if c not in k_spec)
    h = jnp.einsum(f"{x_spec},{k_spec[:n_in]}{r}->{batch}{r}", x.astype(dtype), a.astype(dtype))
    y = jnp.einsum(f"{batch}{r},{r}{k_spec[n_in:]}->{out_spec}", h, b.astype(dtype))
    return y * jnp.asarray(spec.scaling, dtype)


def merged_kernel(kernel: np.ndarray, a: np.ndarray, b: np.ndarray, scaling: float) -> np.ndarray:
    """W + s · A B for kernel (in..., out...), a (in..., r), b (r, out...) (float32 numpy); scanned layers (a
    leading L axis on all three) layer by layer."""
    kernel, a, b = np.asarray(kernel), np.asarray(a), np.asarray(b)
    if a.ndim + b.ndim - 2 != kernel.ndim:  # stacked: (L, ...) each
        return np.stack([merged_kernel(k, x, y, scaling) for k, x, y in zip(kernel, a, b)])
    n_in = a.ndim - 1
    delta = np.tensordot(np.asarray(a, np.float64), np.asarray(b, np.float64), axes=([n_in], [0]))
    return (np.asarray(kernel, np.float64) + scaling * delta).astype(np.float32).reshape(np.shape(kernel))


def merge(cfg: ModelConfig, params: Any) -> tuple[ModelConfig, Any]:
    """(cfg without LoRA, params with every adapter folded into its kernel: merged_kernel) — the same function
    as the adapted model, as plain float32 numpy arrays (a nested dict, as model.init gives it unboxed)."""
    def fold(tree: Any) -> Any:
        if not isinstance(tree, dict):
            return np.asarray(jax.device_get(tree), np.float32)
        out = {k: fold(v) for k, v in tree.items() if k not in ADAPTER_NAMES}
        if "lora_a" in tree:
            out["kernel"] = merged_kernel(out["kernel"], fold(tree["lora_a"]), fold(tree["lora_b"]), cfg.lora.scaling)
        return out

    return cfg.replace(lora=LoraSpec()), fold(dict(params))


def _names(path: tuple) -> list[str]:
    return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def is_trained(cfg: ModelConfig, path: tuple) -> bool:
    """Whether the parameter at `path` (a key path of the params tree) trains: every one without LoRA; under
    LoRA an adapter's (lora_a, lora_b) or one of spec.lora.TRAINED_MODULES'."""
    if not cfg.lora.rank:
        return True
    names = _names(path)
    return names[-1] in ADAPTER_NAMES or names[0] in TRAINED_MODULES


def trained_mask(cfg: ModelConfig, params: Any) -> Any:
    """A tree of bools shaped like `params` (plain arrays, or model.init's nn.Partitioned boxes: one bool per
    box, so a masked optimizer state holds no box of a frozen parameter either): is_trained per leaf."""
    return jax.tree_util.tree_map_with_path(lambda path, _: is_trained(cfg, path), params,
                                            is_leaf=lambda x: isinstance(x, nn.Partitioned))


def freeze(cfg: ModelConfig, params: Any) -> Any:
    """`params` with the frozen leaves behind lax.stop_gradient (no weight gradient is computed for them); the
    same tree without LoRA."""
    if not cfg.lora.rank:
        return params
    return jax.tree_util.tree_map_with_path(
        lambda path, p: p if is_trained(cfg, path) else jax.lax.stop_gradient(p), params)
