"""The Task interface the training loop calls."""
from __future__ import annotations

from typing import Any, Protocol

import flax.linen as nn
import jax
import numpy as np

Batch = dict[str, jax.Array]


class Task(Protocol):
    name: str

    def batch_spec(self, spec: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Global-batch array shapes and dtypes, keyed like the iterator's batches."""

    def make_iterator(self, spec: Any, *, split: str, global_batch_size: int, seed: int, process_index: int,
                      process_count: int, shuffle: bool, repeat: bool, data: Any = None) -> Any:
        """A checkpointable grain iterator of this process's rows (dicts of numpy arrays). `data`: the run's
        resolved data (transformer.data.identity.RunData: the one tokenizer and fingerprints), None: resolved
        from spec.data."""

    def init_inputs(self, spec: Any) -> tuple[np.ndarray, ...]:
        """Positional arguments for `model.init` (batch of 1)."""

    def forward(self, model: nn.Module, params: Any, batch: Batch, *, deterministic: bool,
                rngs: dict | None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(logits_B...V, targets_B..., weights_B...) — the loss is weighted cross-entropy."""
