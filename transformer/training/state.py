"""Train state, created directly in its sharded layout.

`jax.eval_shape` gives the abstract state with logical names on every parameter; the mesh rules turn
those into NamedShardings; `jax.jit(init, out_shardings=...)` then materialises each parameter and
optimizer moment already split across devices (no full copy on any one device). Under μP
(model.parametrization="mup") the model's initialisation is rescaled here, by the logical names of its
parameters (transformer/layers/mup.py), and `lr_multipliers` gives the optimizer its per-parameter factors.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from transformer.layers import lora, mup
from transformer.spec import TrainSpec
from transformer.training import sharding
from transformer.training.optimizer import make_optimizer, with_peak_lrs


@flax.struct.dataclass
class TrainState:
    step: jax.Array      # int32 scalar: number of updates applied
    params: Any          # float32 parameters (plain arrays, unboxed)
    opt_state: Any       # optax state, sharded like the parameters it mirrors


def _init_boxed(model: nn.Module, tx: optax.GradientTransformation, rng: jax.Array,
                init_inputs: tuple) -> TrainState:
    params = model.init(rng, *init_inputs)["params"]   # nn.Partitioned boxes carry logical names
    params = mup.rescale_init(model.cfg, params)        # μP's hidden-weight init (SP: unchanged)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def model_optimizer(model: nn.Module, train_cfg: TrainSpec | Any, init_inputs: tuple) -> optax.GradientTransformation:
    """The training optimizer for `model`: make_optimizer with the model's μP learning-rate multipliers (none
    under SP) and, under LoRA, only the parameters it trains (layers/lora.py). The loop and the benchmark build
    it here, so neither can leave μP's rates or LoRA's freezing out."""
    cfg = model.cfg
    trained = (lambda params: lora.trained_mask(cfg, params)) if cfg.lora.rank else None
    return make_optimizer(train_cfg, lr_multipliers(model, init_inputs), trained)


def lr_multipliers(model: nn.Module, init_inputs: tuple) -> Any:
    """μP's per-parameter Adam learning-rate multipliers for `model` (make_optimizer's `lr_multipliers`),
    classified from the logical names of its parameters; None under SP."""
    if model.cfg.parametrization == "sp":
        return None
    boxed = jax.eval_shape(lambda r: model.init(r, *init_inputs), jax.random.PRNGKey(0))["params"]
    return mup.lr_multipliers(model.cfg, boxed)


def abstract_state(model: nn.Module, tx: optax.GradientTransformation, init_inputs: tuple, mesh: Mesh,
                   mesh_rules: Any) -> tuple[TrainState, TrainState]:
    """(abstract unboxed state with shardings attached, the shardings) — no arrays allocated.

    `init_inputs`: the example arguments of `model.init` (a task's `init_inputs(spec)`). Callable inside the
    loop's mesh and rules context too (the non-finite replay): the rules are given explicitly, never taken from it.
    """
    with nn.logical_axis_rules(()):  # unboxing adds no constraints of an enclosing context's rules
        boxed = jax.eval_shape(lambda r: _init_boxed(model, tx, r, init_inputs), jax.random.PRNGKey(0))
        unboxed = nn.unbox(boxed)
    shardings = sharding.logical_shardings(boxed, mesh, mesh_rules)
    sharding.check_divisible(unboxed, shardings)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), unboxed, shardings)
    return abstract, shardings


def init_state(model: nn.Module, tx: optax.GradientTransformation, seed: int, init_inputs: tuple, mesh: Mesh,
               mesh_rules: Any) -> tuple[TrainState, TrainState]:
    """A freshly initialised state, sharded on `mesh`; returns (state, shardings)."""
    _, shardings = abstract_state(model, tx, init_inputs, mesh, mesh_rules)
    # Traced without logical-axis rules (also inside the loop's context: the non-finite replay): the out_shardings
    # alone place every array, and flax's unboxing then adds no sharding constraints of its own to the (reshaped)
    # initialisers.
    init = jax.jit(lambda r: nn.unbox(_init_boxed(model, tx, r, init_inputs)), out_shardings=shardings)
    with nn.logical_axis_rules(()):
        return init(jax.random.PRNGKey(seed)), shardings


def fresh_state(model: nn.Module, tx: optax.GradientTransformation, train_cfg: TrainSpec | Any, init_inputs: tuple, mesh: Mesh,
                mesh_rules: Any) -> TrainState:
    """Step 0 of a run: initialised from train.seed (init_state), its peak learning rate in the optimizer state."""
    state, _ = init_state(model, tx, int(train_cfg.seed), init_inputs, mesh, mesh_rules)
    return state.replace(opt_state=with_peak_lrs(state.opt_state, float(train_cfg.learning_rate)))
