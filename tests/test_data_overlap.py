"""Evaluation on training data is refused before anything trains (issue 19, hole 2): an eval split that is
the train split, eval files that are train files (by path or by content) or hold train documents; the
document-level overlap of the two cache splits is recorded in the cache and reported in summary.json
(tests/test_data_identity.py checks the summary key on a trained run)."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from test_data_files import _texts, data_config, write_mixed_folder

from configs.lm import get_config
from transformer.data import pipeline, sources, token_cache, tokenizers
from transformer.spec import ConfigError
from transformer.training.resolve import resolve


def _lm_config(data_cfg):
    config = get_config("gpt2_tiny")
    config.data = data_cfg
    return config


def test_eval_split_equal_to_train_split_is_refused(corpus_dir):
    config = get_config("gpt2_tiny")
    config.data.data_dir = corpus_dir
    config.data.eval_split = config.data.train_split
    with pytest.raises(ConfigError, match=r"data.eval_split='train' is data.train_split"):
        resolve(config, 1, 1)  # what train and --dry_run run before anything is read or compiled
    with pytest.raises(ConfigError, match="data.eval_split"):
        pipeline.make_lm_iterator(config.data, split="train", global_batch_size=2, seed=0)


def test_eval_files_naming_a_train_file_are_refused(tmp_path):
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(40))
    same = data_config(tmp_path, folder, eval_files=os.path.join(folder, "d00*.txt"))
    with pytest.raises(ConfigError, match=r"data.eval_files names \d+ file\(s\) of data.files .*d000.txt"):
        resolve(_lm_config(same), 1, 1)
    other = str(tmp_path / "held")  # a copy elsewhere: another path, the same content
    os.makedirs(other)
    shutil.copy(os.path.join(folder, "d001.txt"), os.path.join(other, "copy.txt"))
    copied = data_config(tmp_path, folder, eval_files=os.path.join(other, "*.txt"))
    with pytest.raises(ConfigError, match=r"have the content of a file of data.files .*copy.txt = .*d001.txt"):
        resolve(_lm_config(copied), 1, 1)


def test_eval_documents_that_are_train_documents_are_refused_when_the_cache_is_built(tmp_path):
    folder = str(tmp_path / "docs")
    texts = _texts(40)
    write_mixed_folder(folder, texts)
    held = str(tmp_path / "held")
    os.makedirs(held)
    with open(os.path.join(held, "eval.jsonl"), "w") as f:  # 3 fresh documents and 2 of the training files'
        for t in _texts(3, seed=9) + texts[:2]:
            f.write(json.dumps({"text": t}) + "\n")
    cfg = data_config(tmp_path, folder, eval_files=os.path.join(held, "*.jsonl"))
    resolve(_lm_config(cfg), 1, 1)  # different files: the settings pass
    with pytest.raises(ConfigError, match=r"data.eval_files: 2 of its 5 documents are also documents of data.files"):
        pipeline.make_lm_iterator(cfg, split=cfg.eval_split, global_batch_size=2, seed=0)


def test_held_out_documents_never_overlap_and_the_count_is_recorded(tmp_path):
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(40) * 2)  # every document twice: held out by content, both copies go one way
    cfg = data_config(tmp_path, folder)
    it = pipeline.make_lm_iterator(cfg, split=cfg.train_split, global_batch_size=2, seed=0)
    path = token_cache.cache_path(cfg, tokenizers.ByteTokenizer())
    assert token_cache.read_meta(path)[token_cache.OVERLAP_KEY] == 0 == it.eval_train_overlap_documents


def test_overlap_of_two_tfds_splits_is_counted_document_by_document(corpus_dir):
    """The count in the cache equals a count made another way: the texts of the two splits as Python sets."""
    config = get_config("gpt2_tiny")
    config.data.data_dir = corpus_dir
    tok = tokenizers.ByteTokenizer()
    path = token_cache.ensure_cache(config.data, tok, verbose=False)
    train = {t for t in sources.texts(config.data, "train")}
    expected = sum(t in train for t in sources.texts(config.data, "eval"))
    assert token_cache.overlap_documents(path) == expected
