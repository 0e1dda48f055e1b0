"""Masked language modelling (BERT) on packed rows (encoder-only models)."""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.data.mlm import make_mlm_iterator, mlm_vocab_size

MLM_KEYS = ("inputs", "targets", "segment_ids", "positions")


class MLMTask:
    """Loss on the selected (masked, replaced or kept) tokens only; see transformer/data/mlm.py."""

    name = "mlm"

    def vocab_size(self, config: Any, tokenizer: Any) -> int:
        """The tokenizer's vocabulary plus the MASK id."""
        return mlm_vocab_size(tokenizer)

    def batch_spec(self, config: Any) -> dict:
        shape = (config.train.batch_size, config.data.seq_len)
        return {k: (shape, np.int32) for k in MLM_KEYS} | {"weights": (shape, np.float32)}

    def make_iterator(self, config: Any, **kwargs: Any):
        return make_mlm_iterator(config.data, **kwargs)

    def init_inputs(self, config: Any) -> tuple:
        return (np.zeros((1, config.data.seq_len), np.int32),)

    def forward(self, model, params, batch, *, deterministic, rngs):
        logits_BTV = model.apply({"params": params}, batch["inputs"], batch["positions"], batch["segment_ids"],
                                 deterministic=deterministic, rngs=rngs)
        return logits_BTV, batch["targets"], batch["weights"]
