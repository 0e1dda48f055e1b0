"""Attention heads removed for real: `model.pruned_heads` and the heads each attention layer keeps (standard
library only).

Legend: N query heads, K key/value heads, G = N // K query heads per key/value head (a group).

`model.pruned_heads` is "" (none) or a JSON object {attention layer: [removed query heads]}, the layer named by its
module path in the parameter tree (`attention_paths`: "blocks/layers_0/attention" in a decoder,
"encoder/blocks/layers_0/attention" in an encoder, and in an encoder–decoder also
"decoder/blocks/layers_0/cross_attention"), the heads numbered as in the unpruned model (as Hugging Face's
config.pruned_heads numbers them). A layer keeps the other heads, in order: its q/k/v/out kernels have only their
rows (layers/attention.py), and train.init_from an unpruned (or less pruned) model takes exactly those rows
(training/warm_start.py). Grouped-query attention: a key/value head stays while any of its G query heads does,
and every kept group must keep as many query heads (the attention pairs query head n with key/value head n // G'),
so pruning removes whole groups there, or the same number from each (`units`: what one pruning step removes).
At least one head stays in each layer. Parsed once per configuration (`parse` is cached on the JSON text).
"""
from __future__ import annotations

import functools
import json
from typing import Any, Mapping

from transformer.spec.errors import ConfigError


def attention_paths(cfg: Any) -> list[str]:
    """Every attention layer's module path of the model `cfg` (a ModelConfig) builds, in call order."""
    if cfg.family == "decoder":
        return [f"blocks/layers_{i}/attention" for i in range(cfg.num_layers)]
    if cfg.family == "encoder":
        return [f"encoder/blocks/layers_{i}/attention" for i in range(cfg.num_layers)]
    out = [f"encoder/blocks/layers_{i}/attention" for i in range(cfg.encoder_layers)]
    for i in range(cfg.num_layers):
        out += [f"decoder/blocks/layers_{i}/attention", f"decoder/blocks/layers_{i}/cross_attention"]
    return out


def canonical(value: Any) -> str:
    """model.pruned_heads as canonical JSON text (sorted layers and heads; empty lists dropped; "" for none), from
    "", a JSON object's text or a mapping."""
    if isinstance(value, str):
        if not value.strip():
            return ""
        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError(f"model.pruned_heads={value!r} is not JSON: give a JSON object {{\"<attention layer>\": "
                              f"[heads], ...}} (or \"\" for none)") from None
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if not isinstance(value, Mapping) or not all(
            isinstance(h, list | tuple) and all(isinstance(i, int) and not isinstance(i, bool) for i in h)
            for h in value.values()):
        raise ConfigError(f"model.pruned_heads={value!r} must map attention layers to lists of head numbers, e.g. "
                          f"{{\"blocks/layers_0/attention\": [1, 3]}}")
    d = {str(k): sorted(set(h)) for k, h in value.items() if h}
    return json.dumps(dict(sorted(d.items())), separators=(",", ":")) if d else ""


@functools.lru_cache(maxsize=256)
def parse(text: str) -> dict[str, tuple[int, ...]]:
    """The canonical text as {layer path: removed query heads}."""
    return {k: tuple(v) for k, v in json.loads(text).items()} if text else {}


def units(num_heads: int, kv_heads: int) -> list[tuple[int, ...]]:
    """What pruning removes at a time in a layer of N query and K key/value heads: single heads under multi-head
    (K = N) and multi-query (K = 1) attention, whole groups of G query heads (with their key/value head) under
    grouped-query attention."""
    if kv_heads in (1, num_heads):
        return [(n,) for n in range(num_heads)]
    G = num_heads // kv_heads
    return [tuple(range(k * G, (k + 1) * G)) for k in range(kv_heads)]


def kept_heads(num_heads: int, kv_heads: int, removed: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(kept query heads, kept key/value heads) of a layer of N query and K key/value heads without `removed`."""
    G = num_heads // kv_heads
    q = tuple(n for n in range(num_heads) if n not in set(removed))
    return q, tuple(sorted({n // G for n in q}))


def check(cfg: Any) -> None:
    """ConfigError unless cfg.pruned_heads (canonical text) names attention layers of this model and heads in
    them, keeps a head in every layer and keeps equal groups under grouped-query attention."""
    removed = parse(cfg.pruned_heads)
    if not removed:
        return
    if cfg.scan_layers:
        raise ConfigError("model.pruned_heads gives layers different head counts, which scanned layers (one block "
                          "traced for all) cannot have: set model.scan_layers=False")
    paths = attention_paths(cfg)
    unknown = sorted(set(removed) - set(paths))
    if unknown:
        raise ConfigError(f"model.pruned_heads names {', '.join(map(repr, unknown))}, not an attention layer of this "
                          f"model; its layers: {', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''}")
    N, K = cfg.num_heads, cfg.kv_heads
    for path, heads in removed.items():
        if heads[0] < 0 or heads[-1] >= N:
            raise ConfigError(f"model.pruned_heads[{path!r}]={list(heads)}: heads are numbered 0..{N - 1}")
        q, kv = kept_heads(N, K, heads)
        if not q:
            raise ConfigError(f"model.pruned_heads[{path!r}] removes all {N} heads; keep at least one per layer")
        per_group = {sum(1 for n in q if n // (N // K) == k) for k in kv}
        if len(per_group) > 1:
            raise ConfigError(f"model.pruned_heads[{path!r}]={list(heads)}: with {K} key/value heads (groups of "
                              f"{N // K} query heads) every kept group must keep as many query heads (kept per "
                              f"group: {sorted(per_group)}); remove whole groups (heads.units)")


def layer_heads(cfg: Any, path: str) -> tuple[int, int]:
    """(query heads, key/value heads) the attention layer at `path` has."""
    removed = parse(cfg.pruned_heads).get(path)
    if not removed:
        return cfg.num_heads, cfg.kv_heads
    q, kv = kept_heads(cfg.num_heads, cfg.kv_heads, removed)
    return len(q), len(kv)


def removed_total(cfg: Any) -> int:
    """The query heads removed over all attention layers."""
    return sum(len(h) for h in parse(cfg.pruned_heads).values())
