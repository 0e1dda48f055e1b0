"""The language-modelling pipeline: documents -> token cache -> packed rows by global index -> batches.

Every source (a TFDS dataset or local files, sources.py) is tokenized once into the token cache
(token_cache.py); rows are packed from it by global row index (packed.py) and read as global batches
(batches.py), so the batch of step s is a function of (config, seed, s) alone.

Shapes: B = local batch rows (global batch // process count), T = data.seq_len.
Each batch is a dict of numpy arrays, all [B, T]:
  inputs      int32  token ids
  targets     int32  the next token (inputs shifted left by one within the packed stream)
  segment_ids int32  0 = padding, 1, 2, ... = the documents (or document pieces) in the row
  positions   int32  position within the document piece, restarting at 0 for each segment
  weights     float32 1 where `targets` is the real next token of the same document, else 0

Documents are `bos + tokens + eos`, concatenated and split into rows of T + 1 tokens (a document
longer than a row continues in the next row, as a new segment whose positions restart at 0); a row's
first T tokens are the inputs, its last T the targets.
"""
from __future__ import annotations

import numpy as np
import scipy.stats

from transformer.data import batches, packed, sources, token_cache
from transformer.data.identity import RunData, resolve_data
from transformer.data.packed import lm_features  # noqa: F401 - the features, defined with the packing
from transformer.spec import DataSpec


def shuffle_seed(data_cfg: DataSpec, seed: int) -> int:
    """The document-order seed of a pipeline: (data.shuffle_seed, seed) mixed into 32 bits."""
    return int(np.random.SeedSequence([int(data_cfg.shuffle_seed), int(seed)]).generate_state(1)[0])


def _check(process_index: int, process_count: int) -> None:
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} must be in [0, process_count={process_count})")


def make_lm_iterator(data_cfg: DataSpec, *, split: str, global_batch_size: int, seed: int,
                     process_index: int = 0, process_count: int = 1, shuffle: bool = True, repeat: bool = True,
                     transform: packed.RowTransform | None = None, transform_seed: int = 0,
                     data: RunData | None = None, rows: batches.RowBlocks | None = None,
                     cache: tuple[str, str] | None = None) -> batches.BatchIterator:
    """A checkpointable iterator over this process's [B, T] LM batches (see the module docstring).

    Process p of n reads rows [p·B, (p+1)·B) of each global batch (B = global_batch_size // n), or `rows`. Its state
    is the next global batch index (batches.py). `shuffle`: each epoch a seeded permutation of the
    documents (else in order); `repeat=False`: one pass, the last batch padded with all-zero rows
    (weights 0). `transform`: a per-row random transform of the features (packed.RowTransform).
    `data`: the run's resolved data (identity.resolve_data: its tokenizer, its fingerprints), so nothing is
    re-derived; default: resolved here from `data_cfg`. `rows`: the rows of each global batch this process
    feeds (batches.process_rows of the batch sharding), default rows [p·B, (p+1)·B). `cache`: (token cache
    directory, its split) to read instead of `split` of the run's cache (a named evaluation set, eval_sets.py).
    """
    data_cfg = DataSpec.of(data_cfg)  # checked: data.seq_len, data.worker_count, the splits
    _check(process_index, process_count)
    rows = batches.default_rows(global_batch_size, process_index, process_count) if rows is None else rows
    if cache is None:
        split_name = sources.cache_split(data_cfg, split)
        path = (data if data is not None else resolve_data(data_cfg)).ensure_cache()
    else:
        path, split_name = cache
    dataset = packed.make_packed_batches(
        path, split_name, seq_len=int(data_cfg.seq_len), global_batch_size=global_batch_size,
        seed=shuffle_seed(data_cfg, seed), row_blocks=rows, shuffle=shuffle, repeat=repeat, transform=transform,
        transform_seed=transform_seed)
    meta = token_cache.read_meta(path)
    it = batches.BatchIterator(dataset, worker_count=int(data_cfg.worker_count),
                               split_tokens=int(meta[split_name]["tokens"]))
    if cache is None:
        it.eval_train_overlap_documents = token_cache.overlap_documents(path)  # for summary.json
    return it


def unigram_entropy(data_cfg: DataSpec, split: str, max_tokens: int = 1_000_000,
                    data: RunData | None = None) -> float:
    """Entropy (nats/token) of the unigram distribution of the targets (tokens + eos) in `split`.

    A model that ignores context cannot do better than this loss; reads documents in order until
    `max_tokens` tokens.
    """
    data = data if data is not None else resolve_data(data_cfg)
    # the cached documents (bos + ids + eos) in order, bos left out
    cached = token_cache.open_split(data.ensure_cache(), sources.cache_split(data_cfg, split))
    n = min(max_tokens + len(cached.offsets), len(cached.tokens))
    is_bos_N = np.zeros(n, bool)
    is_bos_N[cached.offsets[cached.offsets < n]] = True
    ids_N = np.asarray(cached.tokens[:n])[~is_bos_N][:max_tokens]
    return float(scipy.stats.entropy(np.bincount(ids_N, minlength=data.tokenizer.vocab_size)))
