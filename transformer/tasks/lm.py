"""Next-token language modelling on packed rows (decoder-only models)."""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.data import make_lm_iterator

LM_KEYS = ("inputs", "targets", "segment_ids", "positions")


class LMTask:
    name = "lm"

    def batch_spec(self, spec: Any) -> dict:
        shape = (spec.train.batch_size, spec.data.seq_len)
        return {k: (shape, np.int32) for k in LM_KEYS} | {"weights": (shape, np.float32)}

    def make_iterator(self, spec: Any, **kwargs: Any):
        return make_lm_iterator(spec.data, **kwargs)

    def init_inputs(self, spec: Any) -> tuple:
        return (np.zeros((1, spec.data.seq_len), np.int32),)

    def forward(self, model, params, batch, *, deterministic, rngs):
        logits_BTV = model.apply({"params": params}, batch["inputs"], batch["positions"], batch["segment_ids"],
                                 deterministic=deterministic, rngs=rngs)
        return logits_BTV, batch["targets"], batch["weights"]

    def forward_hidden(self, model, params, batch, *, deterministic, rngs):
        """(final hidden states x_BTD, logits_fn: x_B...D -> logits_B...V, targets, weights), for the
        chunked loss (train.loss_chunk_size) that never materialises all B×T×V logits at once."""
        from transformer.models.decoder import output_logits

        x_BTD = model.apply({"params": params}, batch["inputs"], batch["positions"], batch["segment_ids"],
                            deterministic=deterministic, rngs=rngs, return_hidden=True)
        return x_BTD, (lambda h: output_logits(model.cfg, params, h)), batch["targets"], batch["weights"]
