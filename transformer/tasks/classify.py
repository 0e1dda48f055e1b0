"""Sequence classification (encoder-only models with model.num_classes > 0): which standard-library
package a snippet comes from (transformer/data/classification.py). Eval accuracy is per snippet;
compare it with `majority_baseline(config.data)`, the accuracy of always guessing the commonest class.
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

    def vocab_size(self, config: Any, tokenizer: Any) -> int:
        """As the masked LM's (tokenizer + MASK), so that a pre-trained encoder's table fits."""
        return mlm_vocab_size(tokenizer)

    def _check(self, config: Any) -> None:
        classes = classes_of(config.data)
        if config.model.family != "encoder" or config.model.num_classes != len(classes):
            raise ConfigError(f"train.task='classify' needs model.family='encoder' and model.num_classes="
                              f"{len(classes)} (data.classes={list(classes)}); got family="
                              f"{config.model.family!r}, num_classes={config.model.num_classes} "
                              f"(configs/mlm.py:PRESET,classify sets both)")

    def batch_spec(self, config: Any) -> dict:
        self._check(config)
        B, T = config.train.batch_size, config.data.seq_len
        return ({k: ((B, T), np.int32) for k in SEQUENCE_KEYS}
                | {"labels": ((B, 1), np.int32), "weights": ((B, 1), np.float32)})

    def make_iterator(self, config: Any, **kwargs: Any):
        self._check(config)
        return make_classification_iterator(config.data, **kwargs)

    def init_inputs(self, config: Any) -> tuple:
        return (np.zeros((1, config.data.seq_len), np.int32),)

    def forward(self, model, params, batch, *, deterministic, rngs):
        logits_BC = model.apply({"params": params}, batch["inputs"], batch["positions"], batch["segment_ids"],
                                deterministic=deterministic, rngs=rngs)
        return logits_BC[:, None, :], batch["labels"], batch["weights"]
