"""Model families built from a ModelConfig: `resolve(cfg)` checks the names that select registered
layer implementations and fixes "auto" choices; `build_model(cfg)` picks the family's module."""
from __future__ import annotations

import flax.linen as nn

from transformer.spec import FAMILIES, ConfigError, ModelConfig
from transformer.layers import feedforward, norms, positional, sdpa


def _choice(name: str, value: str, valid) -> None:
    if value not in valid:
        raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(valid)}")


def resolve(cfg: ModelConfig, backend: str | None = None) -> ModelConfig:
    """cfg with its registry names checked (positional, activation, norm, attention_impl) and
    attention_impl="auto" replaced by the implementation this platform gets (backend: jax.default_backend()
    unless given); the result is what a run records in its resolved config."""
    _choice("model.positional", cfg.positional, positional.POSITIONAL_ENCODINGS)
    _choice("model.activation", cfg.activation, tuple(feedforward.ACTIVATIONS))
    _choice("model.norm", cfg.norm, tuple(norms.NORMS))
    return cfg.replace(attention_impl=sdpa.resolve_attention_impl(cfg, backend))


def build_model(cfg: ModelConfig) -> nn.Module:
    """The Flax module for the resolved cfg.family: DecoderLM, EncoderModel or EncoderDecoderModel."""
    cfg = resolve(cfg)
    if cfg.family == "decoder":
        from transformer.models.decoder import DecoderLM
        return DecoderLM(cfg)
    if cfg.family == "encoder":
        from transformer.models.encoder import EncoderModel
        return EncoderModel(cfg)
    if cfg.family == "encoder_decoder":
        from transformer.models.encoder_decoder import EncoderDecoderModel
        return EncoderDecoderModel(cfg)
    raise ConfigError(f"model.family={cfg.family!r} is not valid; choose one of {', '.join(FAMILIES)}")
