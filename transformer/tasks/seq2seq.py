"""T5 span corruption with teacher forcing (encoder–decoder models); see transformer/data/span_corruption.py."""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.data.span_corruption import (make_span_corruption_iterator, span_corruption_lengths,
                                              span_corruption_vocab_size)

SOURCE_KEYS = ("inputs", "input_segment_ids", "input_positions")
TARGET_KEYS = ("decoder_inputs", "targets", "target_segment_ids", "target_positions")


class SpanCorruptionTask:
    name = "span_corruption"

    def vocab_size(self, spec: Any, tokenizer: Any) -> int:
        """The tokenizer's vocabulary plus the sentinels (their number depends on data.seq_len)."""
        return span_corruption_vocab_size(spec.data, tokenizer)

    def batch_spec(self, spec: Any) -> dict:
        B, S = spec.train.batch_size, spec.data.seq_len
        T = span_corruption_lengths(spec.data)[1]
        return ({k: ((B, S), np.int32) for k in SOURCE_KEYS} | {k: ((B, T), np.int32) for k in TARGET_KEYS}
                | {"weights": ((B, T), np.float32)})

    def make_iterator(self, spec: Any, **kwargs: Any):
        return make_span_corruption_iterator(spec.data, **kwargs)

    def init_inputs(self, spec: Any) -> tuple:
        return (np.zeros((1, spec.data.seq_len), np.int32),
                np.zeros((1, span_corruption_lengths(spec.data)[1]), np.int32))

    def forward(self, model, params, batch, *, deterministic, rngs):
        logits_BTV = model.apply({"params": params}, batch["inputs"], batch["decoder_inputs"],
                                 batch["input_segment_ids"], batch["target_segment_ids"], batch["input_positions"],
                                 batch["target_positions"], deterministic=deterministic, rngs=rngs)
        return logits_BTV, batch["targets"], batch["weights"]
