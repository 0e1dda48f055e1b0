"""summary.json's `epochs` counts the training split's tokens a run read: a packed row of T targets is T + 1
tokens of the split. Checked against an independent count: the documents begun (bos tokens) in the rows of
one whole pass over the split, which must be every document once, i.e. one epoch."""
from __future__ import annotations

import os

import numpy as np
import pytest

from configs import lm
from transformer.data import get_tokenizer, make_lm_iterator, token_cache
from transformer.tasks import get_task
from transformer.training import run_io


def test_epochs_of_one_pass_is_one(corpus_dir):
    c = lm.get_config("gpt2_tiny")
    c.data.data_dir, c.data.seq_len = corpus_dir, 7  # rows of 8 tokens: 7/8 would be far off
    tokenizer = get_tokenizer(c.data)
    cache = token_cache.ensure_cache(c.data, tokenizer)
    offsets = np.load(os.path.join(cache, "train.offsets.npy"))
    documents, split_tokens = len(offsets) - 1, int(offsets[-1])
    steps = 16
    batch = split_tokens // (c.data.seq_len + 1) // steps  # steps x batch rows: one pass, short of < 16 rows
    it = make_lm_iterator(c.data, split="train", global_batch_size=batch, seed=0, shuffle=False)
    begun = 0  # documents begun in the rows read: their bos among each row's inputs and last target
    for _ in range(steps):
        b = next(it)
        begun += int(np.sum(b["inputs"] == tokenizer.bos_id) + np.sum(b["targets"][:, -1] == tokenizer.bos_id))
    it.close()
    assert begun == documents  # one pass: every document once (the unread tail is < 128 tokens of the last one)

    c.train.batch_size = batch
    summary = run_io.make_summary(
        status="ok", error=None, step=steps, steps=steps, counts={"total": 1, "non_embedding": 1},
        tokens_per_step=batch * c.data.seq_len, fpt=1.0, last={}, task_name="lm", skipped=None, seconds={},
        tps=None, num_devices=1, mesh_shape=(1, 1, 1), train_split_tokens=getattr(it, "split_tokens", split_tokens),
        split_tokens_per_step=_split_tokens_per_step(c))
    assert summary["epochs"] == pytest.approx(begun / documents, rel=1e-5)


def _split_tokens_per_step(c) -> int | None:
    try:
        from transformer.training.run_setup import split_tokens_per_step
    except ImportError:  # the code before run_setup.py, which counted epochs from the targets alone
        return None
    return split_tokens_per_step(get_task(c).name, c)
