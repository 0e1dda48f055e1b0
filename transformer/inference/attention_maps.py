"""Attention inspection: every layer's and head's attention weights for an input, and heatmaps of them.

Legend: B batch, N heads, T query length, S key length, L layers.

`attention_maps(model, params, *inputs)` runs the model once with `sow_attention_weights=True`
(every MultiHeadAttention stores its softmax weights in the "intermediates" collection; the einsum
attention is used so the weights exist) and returns them by module path in call order, e.g.
"blocks/layers_0/attention" -> weights_BNTS (float32; each row sums to 1 over S). Scanned layers
(model.scan_layers) are split back into one entry per layer.

`plot_attention` draws one figure per layer: a grid of heads, each a T × S heatmap with the tokens
as tick labels (`token_labels` makes whitespace and special tokens visible).
"""
from __future__ import annotations

import math
import os
import re
from typing import Any, Sequence

import flax.linen as nn
import numpy as np
from flax import traverse_util

from transformer.data.tokenizers import ByteTokenizer
from transformer.spec import ConfigError

WEIGHTS_NAME = "attention_weights"
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def attention_maps(model: nn.Module, params: Any, *inputs: Any, **kwargs: Any) -> dict[str, np.ndarray]:
    """{module path: weights_BNTS} for every attention layer, in call order.

    `model` must have a `sow_attention_weights` field (DecoderLM and the other families do);
    inputs/kwargs are those of `model.apply` (e.g. tokens_BT, positions_BT, segment_ids_BT).
    """
    if not hasattr(model, "sow_attention_weights"):
        raise ValueError(f"{type(model).__name__} has no sow_attention_weights field; cannot inspect attention")
    probe = model.clone(sow_attention_weights=True)
    _, state = probe.apply({"params": params}, *inputs, mutable=["intermediates"], **kwargs)
    maps: dict[str, np.ndarray] = {}
    for path, value in traverse_util.flatten_dict(state["intermediates"]).items():
        if path[-1] != WEIGHTS_NAME:
            continue
        weights = np.asarray(value[0] if isinstance(value, tuple) else value, np.float32)
        if weights.ndim == 5:  # scanned layers: leading L axis, module path ".../layers/..."
            i = path.index("layers")
            for layer, w_BNTS in enumerate(weights):
                maps["/".join(path[:i] + (f"layers_{layer}",) + path[i + 1:-1])] = w_BNTS
        else:
            maps["/".join(path[:-1])] = weights
    if not maps:
        raise ValueError(f"{type(model).__name__} stored no attention weights")
    return maps


def layer_index(name: str) -> int:
    """The layer number in a module path ("blocks/layers_3/attention" -> 3)."""
    match = re.search(r"layers_(\d+)", name)
    if match is None:
        raise ValueError(f"no layer index in attention module path {name!r}")
    return int(match.group(1))


def _visible(text: str) -> str:
    return "".join(_VISIBLE.get(c, c) for c in text)


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """One readable label per token: its text, with whitespace shown as ␣ ↵ ⇥ and special tokens named.

    Byte tokens of a multi-byte UTF-8 character: the first byte shows the character, the others "+"
    and it (e.g. "é", "+é"); bytes that form no character show as \\xNN.
    """
    special = {tokenizer.pad_id: "<pad>", tokenizer.bos_id: "<bos>", tokenizer.eos_id: "<eos>"}
    ids = [int(i) for i in ids]
    if not isinstance(tokenizer, ByteTokenizer):
        return [special.get(i) or _visible(tokenizer.decode([i])) or f"#{i}" for i in ids]
    offset = int(tokenizer.encode(bytes([0]))[0])
    labels: list[str] = []
    j = 0
    while j < len(ids):
        if ids[j] in special:
            labels.append(special[ids[j]])
            j += 1
            continue
        raw = []
        for i in ids[j:j + 4]:  # a UTF-8 character is at most 4 bytes; special tokens end it
            if i in special:
                break
            raw.append(i - offset)
        char = _utf8_char(raw)
        if char is None:
            labels.append(f"\\x{ids[j] - offset:02x}")
            j += 1
        else:
            n = len(char.encode("utf-8"))
            labels += [_visible(char)] + ["+" + char] * (n - 1)
            j += n
    return labels


def _utf8_char(raw: list[int]) -> str | None:
    """The character that a prefix of these byte values encodes, or None."""
    for n in range(1, len(raw) + 1):
        try:
            return bytes(raw[:n]).decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def plot_attention(weights_NTS: np.ndarray, query_labels: Sequence[str], key_labels: Sequence[str], title: str,
                   path: str, heads: Sequence[int] | None = None) -> str:
    """Write a PNG with one heatmap per head (rows: queries, columns: keys); returns the path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    N, T, S = weights_NTS.shape
    heads = list(range(N)) if heads is None else list(heads)
    bad = [h for h in heads if not 0 <= h < N]
    if bad:
        raise ConfigError(f"heads {bad} out of range; this layer has heads 0..{N - 1}")
    cols = math.ceil(math.sqrt(len(heads)))
    rows = math.ceil(len(heads) / cols)
    cell = max(2.5, 0.16 * max(T, S) + 1.0)   # inches per heatmap: ~0.16" per token keeps labels legible
    fontsize = 8 if max(T, S) <= 48 else 6
    fig, axes = plt.subplots(rows, cols, figsize=(cols * cell + 1.2, rows * cell + 0.8), squeeze=False,
                             constrained_layout=True)
    image = None
    for ax, h in zip(axes.flat, heads):
        image = ax.imshow(weights_NTS[h], cmap="viridis", norm=PowerNorm(0.5, vmin=0.0, vmax=1.0),
                          interpolation="nearest", aspect="equal")
        ax.set_title(f"head {h}", fontsize=fontsize + 2)
        ax.set_xticks(range(S), list(key_labels), rotation=90, fontsize=fontsize)
        ax.set_yticks(range(T), list(query_labels), fontsize=fontsize)
        ax.tick_params(length=0)
        ax.set_xlabel("key", fontsize=fontsize)
        ax.set_ylabel("query", fontsize=fontsize)
    for ax in list(axes.flat)[len(heads):]:
        ax.axis("off")
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight (square-root scale)")
    fig.suptitle(title)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
