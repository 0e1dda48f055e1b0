"""Model families built from a ModelConfig: `build_model(cfg)` picks the family's module."""
from __future__ import annotations

import flax.linen as nn

from transformer.models.config import FAMILIES, ConfigError, ModelConfig


def build_model(cfg: ModelConfig) -> nn.Module:
    """The Flax module for cfg.family: DecoderLM, EncoderModel or EncoderDecoderModel."""
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
