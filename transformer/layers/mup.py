"""μP, the maximal-update parametrization (Yang et al. 2022, "Tensor Programs V"), for Adam.

`model.parametrization="mup"` with `model.mup_base_width` = the d_model at which μP equals the standard
parametrization ("sp"), so hyperparameters tuned in SP at that width carry over, and the optimal learning
rate stays put as the model widens. Every width (d_model, d_ff, heads × head_dim) is taken to grow by the one
width multiplier m = d_model / mup_base_width, as the sweep ladders grow them (transformer/design/grid.py).

Each weight is classified from its logical axis names (nn.with_logical_partitioning, the names the mesh rules
use; a stacked "layers" axis is ignored). Kernels are (in, out) and embedding tables (rows, embed), so:
  input    a finite axis first, width after: the token and position tables ("vocab"/"positions", "embed")
  output   width first, a finite axis last: the untied head ("embed", "vocab"), a classifier ("mlp", "classes")
  hidden   two width dimensions: q/k/v ("embed", "heads", "head_dim"), out, FFN kernels, dense D -> D
  vector   at most one width dimension: biases, norm scales ("heads", "head_dim" counts once: N·H)
and μP is the paper's Table 8 (its equivalent of Table 3 that the `mup` package implements), relative to SP:
  hidden   init std × 1/sqrt(m) (variance ∝ 1/fan_in)        Adam LR × 1/m
  output   init as SP (constant in width)                     Adam LR × 1      forward × 1/m (the logits)
  input, vector   as SP                                       Adam LR × 1
The output multiplier makes the effective readout W/m, of init variance ∝ 1/fan_in² (Table 3's value; we do
not zero it, the paper's App. D.2 alternative, so that μP at the base width is SP exactly). Because input and
output weights are treated alike but for the forward multiplier, a tied embedding is μP too (the `mup`
package's MuSharedReadout): the table is input-like and the shared head's logits are × 1/m.
Attention: μP scores are q·k/H, not q·k/sqrt(H) (q and k become correlated in training, so their dot product
grows like H); normalised to equal SP at the base head dim H₀ = model.mup_base_head_dim (0: the model's own head
dim, i.e. width grows by adding heads of a fixed size, where the rule is SP's): the scale is
(model.attention_scale or 1/sqrt(H₀)) · H₀/H, the `scale` every attention implementation takes (einsum, chunked,
cuDNN, decoding). Weight decay is not scaled: the per-step decay lr·wd stays the same at every width, as in
the `mup` package's MuAdamW.

Initialisation: `rescale_init(cfg, params)` on the parameters `model.init` returns (training/state.py does it,
as `mup.set_base_shapes(..., rescale_params=True)` does to a built model); the learning-rate multipliers go
into the optimizer through `lr_multipliers` (training/optimizer.make_optimizer). Under "sp" every function here
leaves its input untouched, so SP results are bit-identical to a codebase without this module.
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax

from transformer.spec import ModelConfig

KINDS = ("input", "hidden", "output", "vector")
# Logical parameter-axis names that grow with the model's width (heads, kv_heads, head_dim together are one
# dimension of size N·H) and those that do not. A new name must be added to one of them (or STACKED).
WIDTH_GROUPS = {"embed": "embed", "mlp": "mlp", "norm": "norm", "heads": "attn", "kv_heads": "attn",
                "head_dim": "attn"}
FINITE = ("vocab", "positions", "classes", "lora_rank")  # lora_rank: LoRA is refused under μP (spec/model.py)
STACKED = ("layers",)


def param_kind(names: tuple[str | None, ...], path: str = "") -> str:
    """input | hidden | output | vector, from a parameter's logical axis names (see the module docstring)."""
    names = tuple(n for n in names if n not in STACKED)
    unknown = [n for n in names if n not in WIDTH_GROUPS and n not in FINITE]
    if unknown:
        raise ValueError(f"parameter {path or names} has logical axis name(s) {unknown} that μP does not classify: "
                         f"add them to WIDTH_GROUPS or FINITE in transformer/layers/mup.py")
    groups: list[str] = []  # width dimensions in order, adjacent attention axes merged (N·H is one dimension)
    for n in names:
        if n in WIDTH_GROUPS and not (groups and groups[-1] == "attn" == WIDTH_GROUPS[n]):
            groups.append(WIDTH_GROUPS[n])
    finite = [n for n in names if n in FINITE]
    if finite and groups:
        if names[0] in FINITE:
            return "input"
        if names[-1] in FINITE:
            return "output"
        raise ValueError(f"parameter {path or names}: a finite axis between width axes has no μP rule here")
    return "hidden" if len(groups) >= 2 else "vector"


def _mup(cfg: ModelConfig) -> bool:
    return cfg.parametrization == "mup"


def width_multiplier(cfg: ModelConfig) -> float:
    """m = d_model / mup_base_width under μP; 1 under SP."""
    return cfg.d_model / cfg.mup_base_width if _mup(cfg) else 1.0


def init_multiplier(cfg: ModelConfig, kind: str) -> float:
    """Factor on SP's init std: 1/sqrt(m) for hidden weights under μP, else 1."""
    return 1.0 / math.sqrt(width_multiplier(cfg)) if kind == "hidden" else 1.0


def lr_multiplier(cfg: ModelConfig, kind: str) -> float:
    """Factor on the Adam learning rate: 1/m for hidden weights under μP, else 1."""
    return 1.0 / width_multiplier(cfg) if kind == "hidden" else 1.0


def logit_multiplier(cfg: ModelConfig) -> float:
    """The output layer's forward multiplier: 1/m under μP (1 under SP)."""
    return 1.0 / width_multiplier(cfg)


def attention_scale(cfg: ModelConfig) -> float | None:
    """The multiplier of q·k (None: the implementations' 1/sqrt(H)): SP's cfg.attention_scale or None; under μP
    (cfg.attention_scale or 1/sqrt(H₀)) · H₀/H, the same as SP when the head dim is the base one."""
    H, H0 = cfg.dim_per_head, cfg.mup_base_head_dim or cfg.dim_per_head
    if not _mup(cfg) or H0 == H:
        return cfg.attention_scale or None
    return (cfg.attention_scale or 1.0 / math.sqrt(H0)) * H0 / H


def scale_logits(cfg: ModelConfig, logits: jax.Array) -> jax.Array:
    """logits × logit_multiplier(cfg); the same array under SP (no operation at all)."""
    return logits * logit_multiplier(cfg) if _mup(cfg) else logits


def _is_box(x: Any) -> bool:
    return isinstance(x, nn.Partitioned)


def _path(path: tuple) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in path)


def param_kinds(boxed_params: Any) -> Any:
    """The tree of kinds (strings) of `model.init(...)["params"]` (nn.Partitioned leaves, or their eval_shape)."""
    def kind(path: tuple, leaf: Any) -> str:
        if not _is_box(leaf):
            raise ValueError(f"parameter {_path(path)} has no logical axis names (nn.with_logical_partitioning)")
        return param_kind(tuple(leaf.names), _path(path))
    return jax.tree_util.tree_map_with_path(kind, boxed_params, is_leaf=_is_box)


def rescale_init(cfg: ModelConfig, boxed_params: Any) -> Any:
    """SP-initialised parameters (boxed, from model.init) -> μP's: hidden weights × 1/sqrt(m). SP: unchanged."""
    if not _mup(cfg):
        return boxed_params
    kinds = param_kinds(boxed_params)
    return jax.tree.map(lambda kind, box: box.replace_boxed(box.value * init_multiplier(cfg, kind)),
                        kinds, boxed_params, is_leaf=_is_box)


def lr_multipliers(cfg: ModelConfig, boxed_params: Any) -> Any | None:
    """The tree (structure of the unboxed parameters) of Adam learning-rate multipliers; None under SP."""
    if not _mup(cfg):
        return None
    return jax.tree.map(lambda kind: lr_multiplier(cfg, kind), param_kinds(boxed_params))
