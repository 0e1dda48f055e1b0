"""Position-wise feed-forward layers: plain (ReLU, GELU) and gated (SwiGLU, GeGLU; Shazeer 2020).

Legend: B batch, T sequence, D model width, F hidden width (cfg.d_ff).

Activations, registered in ACTIVATIONS by the name `model.activation` selects (checked when a model is
built, transformer.models.resolve; adding one is a line here): "relu"; "gelu" is the exact erf GELU; "gelu_tanh" is the tanh
approximation that GPT-2 uses (HF "gelu_new"), needed for checkpoint parity; "swiglu" gates with SiLU,
"geglu" with the exact GELU and "gelu_tanh_glu" with the tanh GELU (T5 v1.1's "gated-gelu").
Plain: wo(act(wi x)). Gated: wo(act(wi_gate x) * wi_up x). The kernels are (in, out) Projections (LoRA's
targets mlp_in: wi, wi_gate, wi_up; mlp_out: wo).
A gated activation's name ends in "glu" (ModelConfig.gated reads that; parameter counts use it).
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax

from transformer.layers.dtypes import compute_dtypes
from transformer.layers.projection import Projection, lora_of
from transformer.spec import ModelConfig

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": nn.relu,
    "gelu": lambda x: nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),
    "swiglu": nn.silu,   # gated: silu(wi_gate x) * wi_up x
    "geglu": lambda x: nn.gelu(x, approximate=False),  # gated
    "gelu_tanh_glu": lambda x: nn.gelu(x, approximate=True),  # gated (T5 v1.1, Hugging Face "gated-gelu")
}


class FeedForward(nn.Module):
    """x_BTD -> x_BTD through a hidden layer of width cfg.d_ff. `out_std`: init std of wo."""

    cfg: ModelConfig
    out_std: float = 0.02

    @nn.compact
    def __call__(self, x_BTD: jax.Array, deterministic: bool = True) -> jax.Array:
        cfg = self.cfg
        dtype, param_dtype = compute_dtypes(cfg)

        def dense(features: int, names: tuple[str, str], std: float, name: str, target: str) -> Projection:
            equation = "btd,df->btf" if names[0] == "embed" else "btf,fd->btd"
            return Projection(equation, (cfg.d_model if names[0] == "embed" else cfg.d_ff, features), names,
                              bias_names=names[1:] if cfg.use_bias else None, init_std=std, dtype=dtype,
                              param_dtype=param_dtype, lora=lora_of(cfg, target), name=name)

        act = ACTIVATIONS[cfg.activation]
        if cfg.gated:
            h_BTF = act(dense(cfg.d_ff, ("embed", "mlp"), 0.02, "wi_gate", "mlp_in")(x_BTD, deterministic))
            h_BTF = h_BTF * dense(cfg.d_ff, ("embed", "mlp"), 0.02, "wi_up", "mlp_in")(x_BTD, deterministic)
        else:
            h_BTF = act(dense(cfg.d_ff, ("embed", "mlp"), 0.02, "wi", "mlp_in")(x_BTD, deterministic))
        h_BTF = nn.with_logical_constraint(h_BTF, ("batch", "seq", "act_mlp"))
        return dense(cfg.d_model, ("mlp", "embed"), self.out_std, "wo", "mlp_out")(h_BTF, deterministic)
