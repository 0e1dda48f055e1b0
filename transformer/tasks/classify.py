"""Sequence classification (encoder-only models with model.num_classes > 0): which standard-library
package a snippet comes from (transformer/data/classification.py). Eval accuracy is per snippet;
compare it with `majority_baseline(spec.data)`, the accuracy of always guessing the commonest class.
Labels and weights are [B, 1] and logits [B, 1, C], so that every batch array shards like [B, T] ones."""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.data.classification import classes_of, make_classification_iterator
from transformer.data.mlm import mlm_vocab_size
from transformer.spec import ConfigError

SEQUENCE_KEYS = ("inputs", "segment_ids", "positions")


class ClassifyTask:
    name = "classify"

    def vocab_size(self, spec: Any, tokenizer: Any) -> int:
        """As the masked LM's (tokenizer + MASK), so that a pre-trained encoder's table fits."""
        return mlm_vocab_size(tokenizer)

    def _check(self, spec: Any) -> None:
        classes = classes_of(spec.data)
        if spec.model.family != "encoder" or spec.model.num_classes != len(classes):
            raise ConfigError(f"train.task='classify' needs model.family='encoder' and model.num_classes="
                              f"{len(classes)} (data.classes={list(classes)}); got family="
                              f"{spec.model.family!r}, num_classes={spec.model.num_classes} "
                              f"(configs/mlm.py:PRESET,classify sets both)")

    def batch_spec(self, spec: Any) -> dict:
        self._check(spec)
        B, T = spec.train.batch_size, spec.data.seq_len
        return ({k: ((B, T), np.int32) for k in SEQUENCE_KEYS}
                | {"labels": ((B, 1), np.int32), "weights": ((B, 1), np.float32)})

    def make_iterator(self, spec: Any, **kwargs: Any):
        self._check(spec)
        return make_classification_iterator(spec.data, **kwargs)

    def init_inputs(self, spec: Any) -> tuple:
        return (np.zeros((1, spec.data.seq_len), np.int32),)

    def forward(self, model, params, batch, *, deterministic, rngs):
        logits_BC = model.apply({"params": params}, batch["inputs"], batch["positions"], batch["segment_ids"],
                                deterministic=deterministic, rngs=rngs)
        return logits_BC[:, None, :], batch["labels"], batch["weights"]
