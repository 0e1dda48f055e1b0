"""Shared plumbing of the Hugging Face converters: reading/writing checkpoint files, and reshaping
PyTorch weights into this codebase's per-head kernels and back.

Legend: D model width, N query heads, K key/value heads, H head dimension, F hidden width.

PyTorch `nn.Linear` stores weight (out, in); GPT-2's `Conv1D` stores (in, out); flax kernels are
(in, out), and attention kernels keep the heads as their own axis: query (D, N, H), out (N, H, D).
Every array read is float32 numpy (bfloat16/float16 checkpoints are upcast).
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from transformer.spec import ConfigError, MissingInputError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def read_config(path: str) -> dict[str, Any]:
    """PATH/config.json as a dict; FileNotFoundError names what is missing."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise MissingInputError(f"{path} is not a directory (a Hugging Face checkpoint directory is expected)")
    if not os.path.exists(config_path):
        raise MissingInputError(f"{config_path} not found")
    with open(config_path) as f:
        return json.load(f)


def _to_numpy(tensor: Any) -> np.ndarray:
    import torch

    if tensor.is_floating_point():
        tensor = tensor.to(torch.float32)
    return tensor.detach().cpu().numpy()


def _load_file(path: str) -> dict[str, np.ndarray]:
    if path.endswith(".safetensors"):
        from safetensors import safe_open
        with safe_open(path, framework="pt") as f:
            return {k: _to_numpy(f.get_tensor(k)) for k in f.keys()}
    import torch
    return {k: _to_numpy(v) for k, v in torch.load(path, map_location="cpu", weights_only=True).items()}


def load_state_dict(path: str) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint in PATH (safetensors preferred; sharded index files followed)."""
    for name in WEIGHT_FILES:
        file = os.path.join(path, name)
        if not os.path.exists(file):
            continue
        if name.endswith(".index.json"):
            with open(file) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            state: dict[str, np.ndarray] = {}
            for shard in shards:
                state.update(_load_file(os.path.join(path, shard)))
            return state
        return _load_file(file)
    raise MissingInputError(f"no weights in {path}: expected one of {', '.join(WEIGHT_FILES)}")


def save_state_dict(tensors: dict[str, np.ndarray], path: str) -> None:
    """PATH/model.safetensors (metadata format=pt, so `transformers` loads it)."""
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def strip_prefix(state: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """Drop a model wrapper's prefix ("transformer.", "model.", "bert.") where keys carry it."""
    return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}


class StateReader:
    """Takes tensors out of a state dict by name, so that unused (unsupported) weights are caught."""

    def __init__(self, state: dict[str, np.ndarray], family: str):
        self.state, self.family, self.used = state, family, set()

    def __call__(self, name: str) -> np.ndarray:
        if name not in self.state:
            raise ConfigError(f"{self.family} checkpoint has no tensor {name!r}")
        self.used.add(name)
        return self.state[name]

    def check_all_used(self, ignore: tuple[str, ...] = ()) -> None:
        left = sorted(k for k in set(self.state) - self.used if not any(k.endswith(s) for s in ignore))
        if left:
            raise ConfigError(f"{self.family} checkpoint has weights this converter does not map: {', '.join(left[:8])}"
                              f"{' ...' if len(left) > 8 else ''}")

    def layer_norm(self, name: str) -> dict[str, np.ndarray]:
        """A torch LayerNorm `name` as our LayerNorm's {scale, bias}."""
        return {"scale": self(f"{name}.weight"), "bias": self(f"{name}.bias")}


class MissingParameterError(KeyError):
    """A converter asked for a parameter the model does not have (the model does not fit that layout)."""


class TrackedParams(dict):
    """A nested parameter dict ({name: dict | array}) that records the path ("blocks/layers_0/mlp/wo/kernel")
    of every array a converter reads, so that export can check that every parameter was written
    (`unread`). Reading a missing name raises MissingParameterError naming its path."""

    def __init__(self, tree: dict[str, Any], path: str = "", used: set[str] | None = None):
        super().__init__(tree)
        self.path, self.used = path, set() if used is None else used

    def __getitem__(self, key: str) -> Any:
        path = f"{self.path}/{key}" if self.path else str(key)
        if key not in self:
            raise MissingParameterError(path)
        value = dict.__getitem__(self, key)
        if isinstance(value, dict):
            return TrackedParams(value, path, self.used)
        self.used.add(path)
        return value

    def unread(self) -> list[str]:
        """Paths of the arrays no converter has read, sorted."""
        def leaves(tree: dict[str, Any], prefix: str) -> list[str]:
            out = []
            for k, v in tree.items():
                path = f"{prefix}/{k}" if prefix else str(k)
                out += leaves(v, path) if isinstance(v, dict) else [path]
            return out
        return sorted(p for p in leaves(dict(self), self.path) if p not in self.used)


def linear_in_out(weight_OI: np.ndarray) -> np.ndarray:
    """A torch Linear weight (out, in) as a flax kernel (in, out)."""
    return np.ascontiguousarray(weight_OI.T)


def to_heads_in(kernel_DX: np.ndarray, heads: int) -> np.ndarray:
    """(D, heads·H) -> (D, heads, H): a q/k/v projection kernel split per head."""
    D, X = kernel_DX.shape
    return kernel_DX.reshape(D, heads, X // heads)


def to_heads_out(kernel_XD: np.ndarray, heads: int) -> np.ndarray:
    """(heads·H, D) -> (heads, H, D): the attention output kernel split per head."""
    X, D = kernel_XD.shape
    return kernel_XD.reshape(heads, X // heads, D)


def from_heads_in(kernel_DNH: np.ndarray) -> np.ndarray:
    """(D, N, H) -> (D, N·H)."""
    return kernel_DNH.reshape(kernel_DNH.shape[0], -1)


def from_heads_out(kernel_NHD: np.ndarray) -> np.ndarray:
    """(N, H, D) -> (N·H, D)."""
    return kernel_NHD.reshape(-1, kernel_NHD.shape[-1])


def unstack_layers(params: Any) -> Any:
    """Scanned layers (blocks/layers with a leading L axis) as blocks/layers_0 ... layers_{L-1}."""
    if not isinstance(params, dict):
        return params
    out = {}
    for key, value in params.items():
        if key == "blocks" and isinstance(value, dict) and "layers" in value:
            import jax
            stacked = value["layers"]
            L = jax.tree.leaves(stacked)[0].shape[0]
            out[key] = {f"layers_{i}": jax.tree.map(lambda a, i=i: np.asarray(a)[i], stacked) for i in range(L)}
        else:
            out[key] = unstack_layers(value)
    return out
