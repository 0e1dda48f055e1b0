"""Attention-head importance (Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?") and the
pruning curve, for every family (self- and cross-attention).

Legend: N a layer's query heads, ξ a head mask (one value per head of every attention layer).

Each attention layer multiplies head n's output by ξ_n when its "head_mask" collection is given
(layers/attention.py, HEAD_MASK); with ξ = 1 the model is unchanged. The importance of head n is the expected
absolute gradient of the loss with respect to ξ_n, I_n = E |∂L/∂ξ_n|, accumulated over evaluation batches (the
absolute value per batch, as the paper's code does), and `normalized` divides each layer's scores by their L2 norm
(the paper's default, so that layers compare). Masks and scores are keyed by the attention layer's module path
("blocks/layers_0/attention", "decoder/blocks/layers_1/cross_attention"), scanned layers split per layer.

The pruning curve (`pruning_curve`): heads are removed (ξ_n = 0) a unit at a time (spec/pruning.units: single
heads, or whole groups under grouped-query attention; at least one unit left per layer), by ascending importance
recomputed under the current mask after each removal step (the paper's iterative procedure), or in a seeded random
order, and the evaluation loss and accuracy measured at each fraction removed. A mask with zeros computes exactly
what the model pruned of those heads computes (tests/test_heads.py).
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from transformer.layers.attention import HEAD_MASK
from transformer.spec import pruning
from transformer.training.losses import cross_entropy


class MaskedModel:
    """`model` applied with the head masks `masks` (a "head_mask" collection) added to its variables: what a
    task's forward (model.apply({"params": ...}, ...)) then computes is the masked model's."""

    def __init__(self, model: Any, masks: Any):
        self.model, self.masks = model, masks

    def apply(self, variables: dict, *args: Any, **kwargs: Any) -> Any:
        return self.model.apply({**variables, HEAD_MASK: self.masks}, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


class _Probe(MaskedModel):
    """Applies `model` with the head_mask collection mutable, keeping the masks its layers create (ones)."""

    def apply(self, variables: dict, *args: Any, **kwargs: Any) -> Any:
        out, state = self.model.apply(variables, *args, mutable=[HEAD_MASK], **kwargs)
        self.masks = state[HEAD_MASK]
        return out


def mask_ones(model: Any, task: Any, params: Any, batch: dict) -> Any:
    """The head-mask tree of `model` (ones: the unmasked model), shaped by one forward pass over `batch`."""
    probe = _Probe(model, None)
    jax.eval_shape(lambda p, b: task.forward(probe, p, b, deterministic=True, rngs=None)[0], params, batch)
    return jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), probe.masks)


def flat(masks: Any) -> dict[str, np.ndarray]:
    """{attention layer path: (N,) values} of a head-mask tree (or a tree shaped like one); scanned layers (a
    leading L axis under ".../layers/...") become one entry per layer."""
    out = {}
    for path, value in traverse_util.flatten_dict(jax.device_get(masks)).items():
        value = np.array(value, np.float32)  # a writable copy
        if value.ndim == 2:
            i = path.index("layers")
            for layer, row in enumerate(value):
                out["/".join(path[:i] + (f"layers_{layer}",) + path[i + 1:-1])] = row
        else:
            out["/".join(path[:-1])] = value
    return out


def unflat(template: Any, values: dict[str, np.ndarray]) -> Any:
    """A head-mask tree shaped like `template` holding `values` (flat's inverse)."""
    tree = traverse_util.flatten_dict(jax.device_get(template))
    out = {}
    for path, value in tree.items():
        if np.ndim(value) == 2:
            i = path.index("layers")
            rows = [values["/".join(path[:i] + (f"layers_{layer}",) + path[i + 1:-1])] for layer in range(len(value))]
            out[path] = jnp.asarray(np.stack(rows), jnp.float32)
        else:
            out[path] = jnp.asarray(values["/".join(path[:-1])], jnp.float32)
    return traverse_util.unflatten_dict(out)


def _loss(model: Any, task: Any, params: Any, masks: Any, batch: dict) -> jax.Array:
    logits, targets, weights = task.forward(MaskedModel(model, masks), params, batch, deterministic=True, rngs=None)
    loss_sum, weight_sum = cross_entropy(logits, targets, weights)
    return loss_sum / jnp.maximum(weight_sum, 1.0)


def importance(model: Any, task: Any, params: Any, batches: Sequence[dict], masks: Any = None) -> dict[str, np.ndarray]:
    """I_n = mean over `batches` of |∂L/∂ξ_n| at the mask `masks` (default: ones), per attention layer."""
    masks = mask_ones(model, task, params, batches[0]) if masks is None else masks
    grad = jax.jit(jax.grad(lambda m, b: _loss(model, task, params, m, b)))
    total = jax.tree.map(jnp.zeros_like, masks)
    for batch in batches:
        total = jax.tree.map(lambda t, g: t + jnp.abs(g), total, grad(masks, batch))
    return {k: v / len(batches) for k, v in flat(total).items()}


def normalized(scores: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each layer's scores divided by their L2 norm (Michel et al.'s default, so that layers compare)."""
    return {k: v / max(float(np.linalg.norm(v)), 1e-20) for k, v in scores.items()}


def evaluate(model: Any, task: Any, params: Any, batches: Sequence[dict], masks: Any) -> dict[str, float]:
    """{"loss", "accuracy"}: the token-mean loss and argmax accuracy of the masked model over `batches`."""
    def sums(m, batch):
        logits, targets, weights = task.forward(MaskedModel(model, m), params, batch, deterministic=True, rngs=None)
        loss_sum, weight_sum = cross_entropy(logits, targets, weights)
        correct = jnp.sum((jnp.argmax(logits, -1) == targets) * weights.astype(jnp.float32))
        return jnp.stack([loss_sum, weight_sum, correct])
    step = jax.jit(sums)
    total = np.sum([np.asarray(step(masks, b), np.float64) for b in batches], axis=0)
    return {"loss": float(total[0] / max(total[1], 1.0)), "accuracy": float(total[2] / max(total[1], 1.0))}


def max_fraction(cfg: Any) -> float:
    """The largest share of the units pruning may remove (one stays in every layer)."""
    units = _units(cfg)
    return (len(units) - len(pruning.attention_paths(cfg))) / len(units)


def _units(cfg: Any) -> list[tuple[str, tuple[int, ...]]]:
    """Every (layer path, unit of heads) pruning can remove, in the layer's numbering."""
    return [(path, unit) for path in pruning.attention_paths(cfg)
            for unit in pruning.units(*pruning.layer_heads(cfg, path))]


def _take(ranked: list[tuple[str, tuple[int, ...]]], left: dict[str, int], count: int) -> list:
    """The first `count` units of `ranked` that leave a unit in their layer (`left`: units left per layer,
    updated)."""
    picked = []
    for path, unit in ranked:
        if len(picked) == count:
            break
        if left[path] > 1:
            left[path] -= 1
            picked.append((path, unit))
    return picked


def _original(cfg: Any, removed: list[tuple[str, tuple[int, ...]]]) -> dict[str, list[int]]:
    """Units removed (in each layer's numbering) as model.pruned_heads' mapping: the heads numbered as in the
    unpruned model, with those cfg removed already."""
    pruned = {k: list(v) for k, v in pruning.parse(cfg.pruned_heads).items()}
    for path, unit in removed:
        kept = pruning.kept_heads(cfg.num_heads, cfg.kv_heads, pruning.parse(cfg.pruned_heads).get(path, ()))[0]
        pruned.setdefault(path, []).extend(kept[n] for n in unit)
    return {k: sorted(v) for k, v in sorted(pruned.items())}


def prune_by_importance(cfg: Any, scores: dict[str, np.ndarray], fraction: float) -> dict[str, list[int]]:
    """The model.pruned_heads mapping that removes `fraction` of the units (spec/pruning.units) with the lowest
    normalized `scores` (importance), one unit staying in every layer."""
    units = _units(cfg)
    left = {path: sum(1 for p, _ in units if p == path) for path in pruning.attention_paths(cfg)}
    target = int(round(fraction * len(units)))
    if not 0 <= target <= len(units) - len(left):
        raise ValueError(f"fraction {fraction} removes {target} of {len(units)} units; at most "
                         f"{len(units) - len(left)} (one per layer stays)")
    norm = normalized(scores)
    ranked = sorted(units, key=lambda u: float(np.sum(norm[u[0]][list(u[1])])))
    return _original(cfg, _take(ranked, left, target))


def pruning_curve(model: Any, task: Any, params: Any, batches: Sequence[dict], fractions: Iterable[float], *,
                  order: str = "importance", seed: int = 0) -> list[dict[str, Any]]:
    """Rows {fraction (of the units removed), removed, units, loss, accuracy, pruned: {path: [heads, numbered as in
    the unpruned model]}} for each of `fractions` (ascending), removing units by `order`: "importance" (the least
    important first, the scores recomputed under the current mask after each step) or "random" (a seeded
    permutation)."""
    cfg = model.cfg
    ones = mask_ones(model, task, params, batches[0])
    values = flat(ones)
    units = _units(cfg)
    per_layer = {path: sum(1 for p, _ in units if p == path) for path in values}
    left = dict(per_layer)
    removable = len(units) - len(per_layer)  # one unit stays in every layer
    random_order = list(np.random.default_rng(seed).permutation(len(units)))
    removed: list[tuple[str, tuple[int, ...]]] = []
    rows = []
    for fraction in sorted(fractions):
        target = int(round(fraction * len(units)))
        if target > removable:
            raise ValueError(f"fraction {fraction} removes {target} of {len(units)} units; at most {removable} "
                             f"(one per layer stays)")
        if len(removed) < target:
            candidates = [u for u in units if u not in removed]
            if order == "random":
                ranked = [units[i] for i in random_order if units[i] in candidates]
            else:
                scores = normalized(importance(model, task, params, batches, unflat(ones, values)))
                ranked = sorted(candidates, key=lambda u: float(np.sum(scores[u[0]][list(u[1])])))
            for path, unit in _take(ranked, left, target - len(removed)):
                values[path] = values[path].copy()
                values[path][list(unit)] = 0.0
                removed.append((path, unit))
        metrics = evaluate(model, task, params, batches, unflat(ones, values))
        rows.append({"fraction": fraction, "removed": len(removed), "units": len(units), **metrics,
                     "pruned": _original(cfg, removed)})
    return rows
