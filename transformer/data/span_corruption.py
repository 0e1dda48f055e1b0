"""T5 span corruption (Raffel et al. 2020, §3.1.4) for encoder–decoder pre-training.

Shapes: B = local batch rows, S = data.seq_len (encoder inputs), T = the derived target length.
A raw row is R consecutive tokens of the packed document stream (the LM pipeline's `inputs`, with
bos/eos between documents). In each row round(0.15 R) tokens are noise, split into
round(noise / 3) spans (random lengths, mean 3) that alternate with the kept spans, the row starting
with a kept one. Then
  inputs  = the row with each noise span replaced by its sentinel, + eos
  targets = sentinel_0 span_0 sentinel_1 span_1 ... + eos
so that replacing each sentinel of `inputs` by the tokens after it in `targets` gives the row back.
R is the longest row whose inputs fit in S (T5's `random_spans_helper`); T = noise + spans + 1.
Sentinels are ids appended to the tokenizer's vocabulary, counting UP: sentinel i = vocab_size + i
(T5 counts down from the top of its vocabulary; counting up keeps ids independent of their number).
A batch holds:
  inputs, input_segment_ids, input_positions                       int32 [B, S]
  decoder_inputs (targets shifted right, DECODER_START_ID first), targets,
  target_segment_ids, target_positions                             int32 [B, T]
  weights                                                          float32 [B, T], 0 at padding
Segment ids are 1 on real tokens and 0 on padding. Each row's noise mask draws from its own generator,
seeded by (seed, global row index) (packed.RowTransform): the same for any number of processes, and
resumed exactly with the iterator's state (the next global batch index).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from transformer.data import batches, tokenizers
from transformer.data.identity import RunData, resolve_data
from transformer.data.mlm import transform_seed
from transformer.data.pipeline import make_lm_iterator
from transformer.spec import ConfigError, DataSpec

DECODER_START_ID = tokenizers.BOS_ID


def _noise_counts(length: int, noise_density: float, mean_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of a row of `length` tokens; (0, 0) when it is too short to corrupt."""
    if length < 2:
        return 0, 0
    noise = min(max(int(round(length * noise_density)), 1), length - 1)
    spans = max(int(round(noise / mean_span_length)), 1)
    return noise, min(spans, noise, length - noise)


def span_lengths(inputs_length: int, noise_density: float, mean_span_length: float) -> tuple[int, int, int]:
    """(raw row length R, targets length T, number of sentinels) for encoder inputs of `inputs_length`."""
    if not 0.0 < noise_density < 1.0:
        raise ConfigError(f"data.noise_density={noise_density!r} must be in (0, 1)")
    if mean_span_length < 1.0:
        raise ConfigError(f"data.mean_noise_span_length={mean_span_length!r} must be at least 1")
    if inputs_length < 4:
        raise ConfigError(f"data.seq_len={inputs_length} is too short for span corruption; use at least 4")

    def corrupted_inputs_length(n: int) -> int:
        noise, spans = _noise_counts(n, noise_density, mean_span_length)
        return n - noise + spans + 1

    raw = inputs_length
    while corrupted_inputs_length(raw + 1) <= inputs_length:
        raw += 1
    while corrupted_inputs_length(raw) > inputs_length:
        raw -= 1
    noise, spans = _noise_counts(raw, noise_density, mean_span_length)
    return raw, noise + spans + 1, spans


def random_spans_noise_mask(length: int, noise_density: float, mean_span_length: float,
                            rng: np.random.Generator) -> np.ndarray:
    """bool[length], True at noise: spans of random lengths alternating kept/noise, kept first."""
    noise, spans = _noise_counts(length, noise_density, mean_span_length)
    if spans == 0:
        return np.zeros(length, bool)

    def segment(num_items: int) -> np.ndarray:  # num_items split into `spans` positive lengths
        cuts = np.sort(rng.choice(num_items - 1, spans - 1, replace=False)) + 1
        return np.diff(np.concatenate([[0], cuts, [num_items]]))

    lengths = np.stack([segment(length - noise), segment(noise)], axis=1).reshape(-1)
    return np.repeat(np.tile([False, True], spans), lengths)


def corrupt(tokens_R: np.ndarray, noise_mask_R: np.ndarray, first_sentinel: int,
            eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of one row (unpadded; see the module docstring)."""
    starts_R = noise_mask_R & ~np.concatenate([[False], noise_mask_R[:-1]])
    sentinels_R = first_sentinel + np.cumsum(starts_R) - 1
    inputs = np.where(starts_R, sentinels_R, tokens_R)[~noise_mask_R | starts_R]
    targets = np.insert(tokens_R[noise_mask_R], np.flatnonzero(starts_R[noise_mask_R]), sentinels_R[starts_R])
    return np.append(inputs, eos_id), np.append(targets, eos_id)


def uncorrupt(inputs: np.ndarray, targets: np.ndarray, first_sentinel: int, eos_id: int) -> np.ndarray:
    """The row back from (inputs, targets): each sentinel of inputs replaced by its span in targets."""
    def pieces(ids: np.ndarray) -> dict[int, list[int]]:
        out, current = {}, None
        for t in ids.tolist():
            if t >= first_sentinel:
                current = out.setdefault(t, [])
            elif current is not None:
                current.append(t)
        return out

    spans = pieces(targets[:-1] if len(targets) and targets[-1] == eos_id else targets)
    body = inputs[:-1] if len(inputs) and inputs[-1] == eos_id else inputs
    row: list[int] = []
    for t in body.tolist():
        row.extend(spans.get(t, []) if t >= first_sentinel else [t])
    return np.asarray(row, np.int32)


def _pad(x: np.ndarray, length: int) -> np.ndarray:
    return np.pad(x, (0, length - len(x)))


class _SpanCorrupt:
    """packed.RowTransform: each row corrupted with its own generator."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, inputs_length: int, targets_length: int,
                 noise_density: float, mean_span_length: float):
        self._first_sentinel, self._eos = tokenizer.vocab_size, tokenizer.eos_id
        self._S, self._T = inputs_length, targets_length
        self._density, self._mean = noise_density, mean_span_length

    def __call__(self, batch: dict[str, np.ndarray], rngs: list[np.random.Generator]) -> dict[str, np.ndarray]:
        B = batch["inputs"].shape[0]
        src_BS = np.zeros((B, self._S), np.int32)
        tgt_BT = np.zeros((B, self._T), np.int32)
        src_len_B1, tgt_len_B1 = np.zeros((B, 1), np.int64), np.zeros((B, 1), np.int64)
        for b in range(B):
            n = int(np.sum(batch["segment_ids"][b] != 0))  # packed rows pad at the end only
            if n == 0:
                continue
            row = batch["inputs"][b, :n]
            inputs, targets = corrupt(row, random_spans_noise_mask(n, self._density, self._mean, rngs[b]),
                                      self._first_sentinel, self._eos)
            src_BS[b], tgt_BT[b] = _pad(inputs, self._S), _pad(targets, self._T)
            src_len_B1[b], tgt_len_B1[b] = len(inputs), len(targets)
        src_pos_BS, tgt_pos_BT = np.arange(self._S)[None].repeat(B, 0), np.arange(self._T)[None].repeat(B, 0)
        src_seg_BS, tgt_seg_BT = (src_pos_BS < src_len_B1), (tgt_pos_BT < tgt_len_B1)
        decoder_inputs_BT = np.concatenate([np.full((B, 1), DECODER_START_ID), tgt_BT[:, :-1]], axis=1)
        return {
            "inputs": src_BS, "input_segment_ids": src_seg_BS.astype(np.int32),
            "input_positions": (src_pos_BS * src_seg_BS).astype(np.int32),
            "decoder_inputs": (decoder_inputs_BT * tgt_seg_BT).astype(np.int32), "targets": tgt_BT,
            "target_segment_ids": tgt_seg_BT.astype(np.int32),
            "target_positions": (tgt_pos_BT * tgt_seg_BT).astype(np.int32),
            "weights": tgt_seg_BT.astype(np.float32),
        }


def span_corruption_lengths(data_cfg: DataSpec) -> tuple[int, int, int]:
    """(raw row length, targets length, number of sentinels) for the data config."""
    return span_lengths(int(data_cfg.seq_len), float(data_cfg.noise_density), float(data_cfg.mean_noise_span_length))


def span_corruption_vocab_size(data_cfg: DataSpec, tokenizer: tokenizers.Tokenizer) -> int:
    """The vocabulary the model needs: the tokenizer's plus the sentinels."""
    return tokenizer.vocab_size + span_corruption_lengths(data_cfg)[2]


def make_span_corruption_iterator(data_cfg: DataSpec, *, split: str, global_batch_size: int,
                                  seed: int, process_index: int = 0, process_count: int = 1, shuffle: bool = True,
                                  repeat: bool = True, data: RunData | None = None,
                                  rows: batches.RowBlocks | None = None) -> batches.BatchIterator:
    """A checkpointable iterator over this process's span-corrupted batches (see the module docstring).

    Needs data.noise_density and data.mean_noise_span_length besides the LM pipeline's settings; `data` as
    make_lm_iterator's.
    """
    data = data if data is not None else resolve_data(data_cfg)
    raw, targets_length, _ = span_corruption_lengths(data_cfg)
    raw_cfg = dataclasses.replace(DataSpec.of(data_cfg), seq_len=raw)  # the rows packed before corruption
    corrupt_fn = _SpanCorrupt(data.tokenizer, int(data_cfg.seq_len), targets_length,
                              float(data_cfg.noise_density), float(data_cfg.mean_noise_span_length))
    return make_lm_iterator(raw_cfg, split=split, global_batch_size=global_batch_size, seed=seed,
                            process_index=process_index, process_count=process_count, shuffle=shuffle,
                            repeat=repeat, transform=corrupt_fn, transform_seed=transform_seed(data_cfg, seed, salt=2),
                            data=data, rows=rows)
