"""Masked language modelling (BERT) on packed rows (encoder-only models)."""
from __future__ import annotations

from typing import Any

from transformer.data.mlm import make_mlm_iterator, mlm_vocab_size
from transformer.spec import ConfigError
from transformer.tasks.lm import LMTask


class MLMTask(LMTask):
    """Loss on the selected (masked, replaced or kept) tokens only; see transformer/data/mlm.py.

    Batches have the LM task's keys and shapes; only the data (masked inputs, weights on the selected
    tokens) and the vocabulary (one MASK id more) differ.
    """

    name = "mlm"

    def vocab_size(self, spec: Any, tokenizer: Any) -> int:
        """The tokenizer's vocabulary plus the MASK id."""
        return mlm_vocab_size(tokenizer)

    def make_iterator(self, spec: Any, **kwargs: Any):
        return make_mlm_iterator(spec.data, **kwargs)

    def forward_hidden(self, *args: Any, **kwargs: Any):
        raise ConfigError("train.loss_chunk_size is for decoder LMs (task lm); set it to 0 for task mlm")
