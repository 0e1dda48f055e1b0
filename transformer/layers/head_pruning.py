"""Removing attention heads from parameters: which axis of each attention parameter indexes heads, and the rows a
more pruned model keeps of a less pruned one's (spec/pruning.py says which heads each layer keeps).

Legend: D model width, N query heads, K key/value heads, H head dimension, r LoRA rank.

In an attention module (layers/attention.py) the heads are an axis of
  query/kernel (D, N, H), query/bias (N, H), query/lora_b (r, N, H)            query heads
  key|value/kernel (D, K, H), key|value/bias (K, H), key|value/lora_b (r, K, H)   key/value heads
  out/kernel (N, H, D), out/lora_a (N, H, r)                                   query heads
and nothing else in the module has a head axis (out/bias (D,), the qk_norm scales (H,), lora_a of q/k/v (D, r),
out/lora_b (r, D)). `take_heads` keeps the listed rows of each; `select` gives the rows a model with
`dst_pruned` keeps of one with `src_pruned` (both model.pruned_heads, canonical), layer by layer.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.spec import ConfigError, pruning

# (projection, parameter) -> (the heads' axis, "q" query heads | "kv" key/value heads)
HEAD_AXES = {("query", "kernel"): (1, "q"), ("query", "bias"): (0, "q"), ("query", "lora_b"): (1, "q"),
             ("out", "kernel"): (0, "q"), ("out", "lora_a"): (0, "q"),
             **{(p, n): (a, "kv") for p in ("key", "value") for n, a in (("kernel", 1), ("bias", 0), ("lora_b", 1))}}


def select(cfg: Any, src_pruned: str, dst_pruned: str) -> dict[str, tuple[list[int], list[int]]]:
    """{attention layer path: (query rows, key/value rows)} that a model with dst_pruned keeps of the parameters of
    one with src_pruned (same shape otherwise; `cfg` gives num_heads, num_kv_heads and the family's layers), for the
    layers where the two differ. ConfigError when dst keeps a head that src has removed already."""
    src, dst = pruning.parse(src_pruned), pruning.parse(dst_pruned)
    N, K = cfg.num_heads, cfg.kv_heads
    out = {}
    for path in pruning.attention_paths(cfg):
        if src.get(path, ()) == dst.get(path, ()):
            continue
        src_q, src_kv = pruning.kept_heads(N, K, src.get(path, ()))
        dst_q, dst_kv = pruning.kept_heads(N, K, dst.get(path, ()))
        missing = sorted(set(dst_q) - set(src_q))
        if missing:
            raise ConfigError(f"model.pruned_heads keeps head(s) {missing} of {path}, which the model it starts from "
                              f"has removed already (its pruned_heads: {list(src.get(path, ()))}); a pruned model "
                              f"can only lose more heads")
        out[path] = ([src_q.index(n) for n in dst_q], [src_kv.index(k) for k in dst_kv])
    return out


def take_heads(projection: str, name: str, leaf: Any, rows: tuple[list[int], list[int]]) -> Any:
    """`leaf` (parameter `name` of attention projection `projection`) with only `rows` (query rows, key/value
    rows) along its heads' axis; a parameter without a head axis as it is."""
    axis_kind = HEAD_AXES.get((projection, name))
    if axis_kind is None:
        return leaf
    axis, kind = axis_kind
    return np.take(np.asarray(leaf), rows[0] if kind == "q" else rows[1], axis=axis)


def prune_params(cfg: Any, params: dict, dst_pruned: str) -> dict:
    """The parameters (a nested dict of arrays, unscanned) of the model `cfg` describes, as the model with
    model.pruned_heads = dst_pruned holds them: each attention layer's rows of the heads it keeps."""
    rows_by_path = select(cfg, cfg.pruned_heads, pruning.canonical(dst_pruned))
    out = _copy(params)
    for path, rows in rows_by_path.items():
        node = out
        for key in path.split("/"):
            node = node[key]
        for projection, p in node.items():
            if isinstance(p, dict):
                node[projection] = {name: take_heads(projection, name, leaf, rows) for name, leaf in p.items()}
    return out


def _copy(tree: Any) -> Any:
    return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def zero_padded(cfg: Any, params: dict) -> tuple[Any, dict]:
    """(cfg with no head pruned, params of that model computing the pruned model's function): every removed head
    back as zero rows of q/k/v/out (its output is multiplied by zero rows of out, so it adds nothing). For layouts
    with one head count for every layer (Hugging Face's)."""
    out = _copy(params)
    N, K = cfg.num_heads, cfg.kv_heads
    for path, removed in pruning.parse(cfg.pruned_heads).items():
        q, kv = pruning.kept_heads(N, K, removed)
        node = out
        for key in path.split("/"):
            node = node[key]
        for projection, p in node.items():
            if not isinstance(p, dict):
                continue
            for name, leaf in p.items():
                axis_kind = HEAD_AXES.get((projection, name))
                if axis_kind is None:
                    continue
                axis, kind = axis_kind
                leaf = np.asarray(leaf)
                full = list(leaf.shape)
                full[axis] = N if kind == "q" else K
                padded = np.zeros(full, leaf.dtype)
                index = [slice(None)] * leaf.ndim
                index[axis] = list(q if kind == "q" else kv)
                padded[tuple(index)] = leaf
                p[name] = padded
    return cfg.replace(pruned_heads=""), out
