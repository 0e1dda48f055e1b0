"""BERT masking for masked-language-model training (Devlin et al. 2019, §3.1).

Shapes: B = local batch rows, T = data.seq_len.
Rows are the `inputs` of the LM pipeline (transformer/data/pipeline.py: packed documents, segment
ids, positions restarting per document); each batch is then masked:
  - every token that is neither padding (segment 0) nor special (the tokenizer's special ids,
    tokenizers.special_ids: pad/bos/eos, a tokenizer.json's special tokens, SentencePiece control and
    unknown pieces; ids 0-2 only for the bytes and trained tokenizers) is selected with probability 0.15;
  - a selected token becomes the MASK id (80%), a random regular (not special) token (10%) or stays
    itself (10%).
A batch holds, all [B, T]:
  inputs      int32  the masked tokens
  targets     int32  the original tokens
  weights     float32 1 at selected tokens (the loss is only taken there), else 0
  segment_ids int32, positions int32: as in the LM pipeline.
The MASK id is the tokenizer's vocab_size (one id appended to the vocabulary): a model needs a
vocabulary of at least tokenizer.vocab_size + 1 (`mlm_vocab_size`).
Each row is masked with its own generator, seeded by (seed, global row index) (packed.RowTransform):
the same seed gives the same masks for any number of processes, and a resumed iterator (its state is
the next global batch index) masks exactly as an uninterrupted one.
"""
from __future__ import annotations

import numpy as np

from transformer.data import batches, tokenizers
from transformer.data.identity import RunData, resolve_data
from transformer.data.pipeline import make_lm_iterator
from transformer.spec import DataSpec

SELECT_RATE = 0.15
MASK_FRACTION, RANDOM_FRACTION = 0.8, 0.1   # the remaining 0.1 keep their token
FIRST_REGULAR_ID = 3                        # bytes and trained SentencePiece: ids below are pad/bos/eos


def mlm_vocab_size(tokenizer: tokenizers.Tokenizer) -> int:
    """The vocabulary a masked LM needs: the tokenizer's plus the MASK id."""
    return tokenizer.vocab_size + 1


def mask_id(tokenizer: tokenizers.Tokenizer) -> int:
    return tokenizer.vocab_size


def regular_ids(tokenizer: tokenizers.Tokenizer) -> np.ndarray:
    """int64 [R]: the ids a masked LM may select and draw as random replacements (all but the special ones)."""
    regular_V = np.ones(tokenizer.vocab_size, bool)
    regular_V[tokenizers.special_ids(tokenizer)] = False
    return np.flatnonzero(regular_V)


def bert_mask(tokens_BT: np.ndarray, segment_ids_BT: np.ndarray, rng: np.random.Generator, *, mask_token: int,
              vocab_size: int, select_rate: float = SELECT_RATE,
              regular: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Masks one batch: {"inputs", "targets", "weights"} (see the module docstring).

    `regular`: the sorted regular ids [R] (regular_ids(tokenizer)); default [FIRST_REGULAR_ID, vocab_size), the
    bytes and trained tokenizers' layout. Random replacements are drawn uniformly from them.
    """
    regular = np.arange(FIRST_REGULAR_ID, vocab_size) if regular is None else np.asarray(regular)
    regular_V = np.zeros(vocab_size, bool)
    regular_V[regular] = True
    candidates_BT = (segment_ids_BT != 0) & regular_V[np.clip(tokens_BT, 0, vocab_size - 1)] & (tokens_BT < vocab_size)
    selected_BT = candidates_BT & (rng.random(tokens_BT.shape) < select_rate)
    action_BT = rng.random(tokens_BT.shape)
    random_BT = regular[rng.integers(0, len(regular), size=tokens_BT.shape)]
    inputs_BT = np.where(selected_BT & (action_BT < MASK_FRACTION), mask_token, tokens_BT)
    to_random_BT = selected_BT & (action_BT >= MASK_FRACTION) & (action_BT < MASK_FRACTION + RANDOM_FRACTION)
    inputs_BT = np.where(to_random_BT, random_BT, inputs_BT)
    return {"inputs": inputs_BT.astype(np.int32), "targets": tokens_BT.astype(np.int32),
            "weights": selected_BT.astype(np.float32)}


class _BertMask:
    """packed.RowTransform: each row masked with its own generator."""

    def __init__(self, tokenizer: tokenizers.Tokenizer):
        self._mask_token = mask_id(tokenizer)
        self._vocab_size = tokenizer.vocab_size
        self._regular = regular_ids(tokenizer)

    def __call__(self, batch: dict[str, np.ndarray], rngs: list[np.random.Generator]) -> dict[str, np.ndarray]:
        rows = [bert_mask(batch["inputs"][b], batch["segment_ids"][b], rng, mask_token=self._mask_token,
                          vocab_size=self._vocab_size, regular=self._regular) for b, rng in enumerate(rngs)]
        masked = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
        return masked | {"segment_ids": batch["segment_ids"], "positions": batch["positions"]}


def transform_seed(data_cfg: DataSpec, seed: int, salt: int) -> int:
    """A 32-bit seed for a random transform, distinct per (shuffle seed, seed, transform); the same in
    every process (rows then draw by their global index)."""
    return int(np.random.SeedSequence([int(data_cfg.shuffle_seed), int(seed), salt]).generate_state(1)[0])


def make_mlm_iterator(data_cfg: DataSpec, *, split: str, global_batch_size: int, seed: int,
                      process_index: int = 0, process_count: int = 1, shuffle: bool = True,
                      repeat: bool = True, data: RunData | None = None,
                      rows: batches.RowBlocks | None = None) -> batches.BatchIterator:
    """A checkpointable iterator over this process's masked [B, T] batches (see the module docstring).

    Arguments as `make_lm_iterator`; `seed` also seeds the masking.
    """
    data = data if data is not None else resolve_data(data_cfg)
    return make_lm_iterator(data_cfg, split=split, global_batch_size=global_batch_size, seed=seed,
                            process_index=process_index, process_count=process_count, shuffle=shuffle,
                            repeat=repeat, transform=_BertMask(data.tokenizer),
                            transform_seed=transform_seed(data_cfg, seed, salt=1), data=data, rows=rows)
