"""The model's hyper-parameters as one frozen, validated dataclass (standard library only).

This module imports nothing of the package but spec.errors (layers, models, training all import it).
configs/*.py take their model block from `model_defaults()` (the defaults below, the one source)
and `ModelConfig.from_dict` builds the dataclass from `config.model`. Validation of plain values
happens here, before anything is traced or compiled; names that select a registered implementation
(positional, activation, norm, attention_impl) are checked where models are built
(`transformer.models.resolve`). Each error names the setting and the valid values.

The compute dtype has ONE user setting, `train.compute_dtype`; `ModelConfig.dtype` is derived from
it (transformer/training/resolve.model_config) and `config.model` may not set it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from transformer.spec.errors import ConfigError
from transformer.spec.errors import check_choice as _choice, check_positive_int as _positive
from transformer.spec import pruning
from transformer.spec.lora import LoraSpec

FAMILIES = ("decoder", "encoder", "encoder_decoder")
NORM_POSITIONS = ("pre", "post")
# The compute dtypes (train.compute_dtype). float16 is not offered: training in it needs loss scaling,
# which the loop does not do; parameters stay in param_dtype (float32 by default).
COMPUTE_DTYPES = ("float32", "bfloat16")
PARAM_DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch", "dots_no_batch_attention")
PARAMETRIZATIONS = ("sp", "mup")  # model.parametrization: standard, or μP (transformer/layers/mup.py)
# model.attention_impl="auto" is resolved when the model is built (transformer.models.resolve).
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and options of a Transformer. Defaults: a small GPT-2-shaped decoder."""

    family: str = "decoder"
    vocab_size: int = 259
    d_model: int = 256
    num_layers: int = 4              # decoder layers (encoder layers for family=encoder)
    num_encoder_layers: int = 0      # encoder_decoder only; 0 means num_layers
    num_heads: int = 4
    num_kv_heads: int = 0            # 0 means num_heads (multi-head); 1 is multi-query
    head_dim: int = 0                # 0 means d_model // num_heads
    d_ff: int = 1024
    max_len: int = 1024              # longest sequence for learned/sinusoidal positions
    positional: str = "learned"
    rope_base: float = 10000.0
    activation: str = "gelu"
    norm: str = "layernorm"
    norm_position: str = "pre"
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    use_bias: bool = True
    embedding_norm: bool = False     # a norm right after the embeddings (BERT)
    scale_embeddings: bool = False   # multiply embeddings by sqrt(d_model) (Vaswani)
    attention_impl: str = AUTO       # auto | einsum | chunked | cudnn (transformer/layers/attention.py)
    sliding_window: int = 0          # 0: attend to every allowed position
    qk_norm: bool = False            # RMSNorm on each head's queries and keys before RoPE (Qwen3, Gemma 3): one
                                     # scale of head_dim per projection, shared by the heads
    parallel_block: bool = False     # x + attention(n(x)) + ffn(n(x)) from ONE norm (GPT-J, PaLM); pre-LN only
    dropout_rate: float = 0.0
    dtype: str = "float32"           # compute dtype: derived from train.compute_dtype, never set in config.model
    param_dtype: str = "float32"
    remat: str = "none"
    scan_layers: bool = False
    num_classes: int = 0             # encoder classification head (0: none)
    # Position biases and Hugging Face T5 parity (positional=alibi | t5_relative; transformer/interop/hf_t5.py).
    relative_num_buckets: int = 32   # t5_relative: rows of each stack's bias table (bidirectional: half per side)
    relative_max_distance: int = 128  # t5_relative: offsets from here on share the last (logarithmic) bucket
    attention_scale: float = 0.0     # multiplier of q·k; 0 means 1/sqrt(head_dim) (T5 folds it into init: 1.0)
    scale_tied_head: bool = False    # encoder_decoder: hidden × d_model^-0.5 before the tied head (T5 v1.0)
    # μP (Yang et al. 2022; transformer/layers/mup.py): init, per-parameter Adam LR, output and attention scale.
    parametrization: str = "sp"      # sp (standard) | mup
    mup_base_width: int = 0          # mup: the d_model at which μP equals SP (where SP hyperparameters were tuned)
    mup_base_head_dim: int = 0       # mup: the head dim at the base width; 0: this model's (width grows by heads)
    # LoRA (spec/lora.py): low-rank adapters on the named projections of a frozen base; rank 0: off. A mapping
    # in config.model (model.lora.rank, .alpha, .dropout, .targets).
    lora: LoraSpec = LoraSpec()
    # Attention heads removed (spec/pruning.py): "" or JSON {"<attention layer path>": [heads], ...}, the heads
    # numbered as in the unpruned model; those layers' q/k/v/out kernels keep only the other heads' rows.
    pruned_heads: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora", LoraSpec.of(self.lora))  # a mapping from config.model, or a LoraSpec
        object.__setattr__(self, "pruned_heads", pruning.canonical(self.pruned_heads))  # JSON text or a mapping
        _choice("model.family", self.family, FAMILIES)
        _choice("model.norm_position", self.norm_position, NORM_POSITIONS)
        _choice("train.compute_dtype", self.dtype, COMPUTE_DTYPES)
        _choice("model.param_dtype", self.param_dtype, PARAM_DTYPES)
        _choice("model.remat", self.remat, REMAT_POLICIES)
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_len"):
            _positive(f"model.{name}", getattr(self, name))
        for name in ("num_kv_heads", "head_dim", "sliding_window", "num_encoder_layers", "num_classes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"model.{name}={value!r} must be a non-negative integer")
        if self.head_dim == 0 and self.d_model % self.num_heads:
            divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0 and h <= 64]
            raise ConfigError(
                f"model.num_heads={self.num_heads} does not divide model.d_model={self.d_model}; "
                f"valid num_heads: {divisors} (or set model.head_dim explicitly)")
        if self.kv_heads and self.num_heads % self.kv_heads:
            divisors = [h for h in range(1, self.num_heads + 1) if self.num_heads % h == 0]
            raise ConfigError(
                f"model.num_kv_heads={self.num_kv_heads} does not divide model.num_heads={self.num_heads}; "
                f"valid num_kv_heads: {divisors} (0 means num_heads)")
        if self.positional == "rope" and self.dim_per_head % 2:
            raise ConfigError(f"model.positional='rope' needs an even head dimension, got {self.dim_per_head}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ConfigError(f"model.dropout_rate={self.dropout_rate!r} must be in [0, 1)")
        if self.rope_base <= 0:
            raise ConfigError(f"model.rope_base={self.rope_base!r} must be positive")
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) \
                or not 0 < self.norm_eps < 1:
            raise ConfigError(f"model.norm_eps={self.norm_eps!r} must be a number in (0, 1): the small constant "
                              f"added to the variance (1e-5 LayerNorm, 1e-6 RMSNorm, 1e-12 BERT)")
        self._check_position_bias_settings()
        self._check_parametrization()
        self._check_block_options()
        pruning.check(self)
        if self.attention_impl == "cudnn":  # the only dtype rule of attention, checked once, here
            if self.dtype == "float32":
                raise ConfigError("model.attention_impl='cudnn' needs train.compute_dtype='bfloat16' (cuDNN's "
                                  "fused kernel has no float32); use attention_impl='auto', 'chunked' or 'einsum'")
            if self.sliding_window and self.family != "decoder":
                raise ConfigError("model.attention_impl='cudnn' has no bidirectional sliding window (jax's cuDNN "
                                  "path supports a left window only); use attention_impl='chunked' with "
                                  f"model.family={self.family!r} and model.sliding_window={self.sliding_window}")

    def _check_position_bias_settings(self) -> None:
        """The settings of the position-bias / T5-parity block above (names checked in models.resolve)."""
        for name in ("relative_num_buckets", "relative_max_distance"):
            _positive(f"model.{name}", getattr(self, name))
        if self.relative_num_buckets < 4:
            raise ConfigError(f"model.relative_num_buckets={self.relative_num_buckets} must be at least 4 (a "
                              "bidirectional stack splits them by direction, then into exact and logarithmic halves)")
        if self.relative_max_distance <= self.relative_num_buckets // 2:
            raise ConfigError(f"model.relative_max_distance={self.relative_max_distance} must exceed "
                              f"relative_num_buckets // 2 = {self.relative_num_buckets // 2} (the offsets that get a "
                              "bucket each); T5 uses 32 buckets and 128")
        if isinstance(self.attention_scale, bool) or not isinstance(self.attention_scale, (int, float)) \
                or self.attention_scale < 0:
            raise ConfigError(f"model.attention_scale={self.attention_scale!r} must be a number >= 0 "
                              "(0 means 1/sqrt(head_dim))")
        if self.scale_tied_head and not (self.tie_embeddings and self.family == "encoder_decoder"):
            raise ConfigError("model.scale_tied_head=True (T5 v1.0's d_model^-0.5 before the tied head) needs "
                              f"model.family='encoder_decoder' and model.tie_embeddings=True (got family="
                              f"{self.family!r}, tie_embeddings={self.tie_embeddings})")

    def _check_block_options(self) -> None:
        """qk_norm and parallel_block: booleans; a parallel block is pre-LN, in a stack without cross-attention."""
        for name in ("qk_norm", "parallel_block"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name}={getattr(self, name)!r} must be True or False")
        if self.parallel_block and self.norm_position != "pre":
            raise ConfigError("model.parallel_block=True sums attention and feed-forward outputs read from one norm "
                              "before them (pre-LN); it needs model.norm_position='pre' (got "
                              f"{self.norm_position!r})")
        if self.parallel_block and self.family == "encoder_decoder":
            raise ConfigError("model.parallel_block=True is defined for model.family='decoder' or 'encoder' (a "
                              "decoder block with cross-attention has no agreed parallel form); got "
                              "family='encoder_decoder'")

    def _check_parametrization(self) -> None:
        _choice("model.parametrization", self.parametrization, PARAMETRIZATIONS)
        for name in ("mup_base_width", "mup_base_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"model.{name}={value!r} must be a non-negative integer")
        if self.parametrization == "mup" and self.lora.rank:
            raise ConfigError("model.lora.rank > 0 with model.parametrization='mup' is not supported (μP has no rule "
                              "for a low-rank adapter's initialisation and learning rate); fine-tune an SP model")
        if self.parametrization != "mup":
            return  # the mup_* settings are ignored under SP, so one config can switch between the two
        if not self.mup_base_width:
            raise ConfigError("model.parametrization='mup' needs model.mup_base_width > 0: the d_model at which μP "
                              "equals the standard parametrization (the width your SP hyperparameters were tuned "
                              f"at), e.g. model.mup_base_width={self.d_model} makes this model the base")
        if self.scale_tied_head:
            raise ConfigError("model.scale_tied_head=True multiplies the hidden states by d_model^-0.5 before the "
                              "tied head, which changes with width; μP (model.parametrization='mup') scales the "
                              "readout by mup_base_width / d_model instead: set model.scale_tied_head=False")
        if self.scale_embeddings:
            raise ConfigError("model.scale_embeddings=True multiplies the embeddings by sqrt(d_model), which grows "
                              "with width; μP (model.parametrization='mup') needs width-independent embedding "
                              "coordinates: set model.scale_embeddings=False or model.parametrization='sp'")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.d_model // self.num_heads

    @property
    def encoder_layers(self) -> int:
        return self.num_encoder_layers or self.num_layers

    @property
    def gated(self) -> bool:
        """Whether the activation is gated (two input projections): SwiGLU, GeGLU — the names ending in
        "glu", the naming convention of transformer/layers/feedforward.ACTIVATIONS."""
        return self.activation.endswith("glu")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, dtype: str = "float32") -> "ModelConfig":
        """Build from `config.model` (a ConfigDict or dict) and the compute dtype (train.compute_dtype);
        unknown keys are an error."""
        d = dict(d.to_dict() if hasattr(d, "to_dict") else d)
        if "dtype" in d:
            raise ConfigError("model.dtype is not a setting: the compute dtype is train.compute_dtype "
                              f"(one of {', '.join(COMPUTE_DTYPES)})")
        fields = {f.name for f in dataclasses.fields(cls)} - {"dtype"}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ConfigError(f"unknown model setting(s) {', '.join('model.' + k for k in unknown)}; "
                              f"valid: {', '.join(sorted(fields))}")
        return cls(**d, dtype=dtype)

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def model_defaults() -> dict[str, Any]:
    """ModelConfig's defaults as the `config.model` block of configs/*.py (the one source of model
    defaults); without `dtype`, which train.compute_dtype sets; `lora` as a mapping (model.lora.rank, ...)."""
    return {f.name: f.default.to_dict() if isinstance(f.default, LoraSpec) else f.default
            for f in dataclasses.fields(ModelConfig) if f.name != "dtype"}
