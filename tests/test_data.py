"""The data layer: the stdlib_py corpus, tokenizers, its token cache and the LM pipeline over it."""
from __future__ import annotations

import json
import math
import os
import platform

import grain
import ml_collections
import numpy as np
import pytest

from configs.common import base_config
from transformer.data import corpus, pipeline, token_cache, tokenizers
from transformer.spec import ConfigError


@pytest.fixture(scope="session")
def data_cfg(tmp_path_factory: pytest.TempPathFactory) -> ml_collections.ConfigDict:
    """The data config, with the full corpus built once (~1 s) in a temporary data dir."""
    cfg = base_config().data
    cfg.data_dir = str(tmp_path_factory.mktemp("tfds"))
    corpus.load_split(cfg, "train")
    return cfg


def _cfg(data_cfg: ml_collections.ConfigDict, **overrides) -> ml_collections.ConfigDict:
    cfg = ml_collections.ConfigDict(data_cfg.to_dict())
    cfg.update(overrides)
    return cfg


def _paths(source) -> list[str]:
    return [source[i]["path"].decode() for i in range(len(source))]


# ---- corpus ----------------------------------------------------------------------------------

def test_split_is_deterministic_and_disjoint(data_cfg, tmp_path):
    train = _paths(corpus.load_split(data_cfg, "train"))
    val = _paths(corpus.load_split(data_cfg, "validation"))
    rebuilt = _paths(corpus.load_split(_cfg(data_cfg, data_dir=str(tmp_path)), "validation"))
    assert sorted(val) == sorted(rebuilt)
    assert not set(train) & set(val)
    assert len(set(train)) == len(train)
    assert all(corpus.split_of(p) == "validation" for p in val)
    assert 0.005 < len(val) / (len(val) + len(train)) < 0.05
    assert not any("site-packages" in p for p in train + val)
    # the rule is a fixed hash of the path (not Python's per-process `hash`): pinned values
    assert [f"m{i}.py" for i in range(300) if corpus.split_of(f"m{i}.py") == "validation"] == [
        "m52.py", "m81.py", "m115.py", "m131.py", "m135.py", "m161.py", "m194.py"]


def test_provenance_metadata(data_cfg):
    md = corpus.corpus_metadata(data_cfg)
    root = corpus.stdlib_root()
    files = corpus.list_stdlib_files(root)
    assert md["python_version"] == platform.python_version()
    assert md["file_count"] == len(files) > 100
    assert md["total_bytes"] == sum(os.path.getsize(os.path.join(root, f)) for f in files)
    for split in ("train", "validation"):
        assert md["split_file_counts"][split] == len(corpus.load_split(data_cfg, split))
    assert sum(md["split_bytes"].values()) == md["total_bytes"]


def test_records_hold_the_file_text(data_cfg):
    src = corpus.load_split(data_cfg, "validation")
    rec = src[0]
    with open(os.path.join(corpus.stdlib_root(), rec["path"].decode()), "rb") as f:
        assert rec["text"] == f.read().decode("utf-8", errors="replace").encode()


def test_missing_dataset_is_a_config_error(data_cfg):
    with pytest.raises(ConfigError, match="data.tfds_name.*data.data_dir"):
        corpus.load_split(_cfg(data_cfg, tfds_name="no_such_dataset_xyz"), "train")


# ---- tokenizers ------------------------------------------------------------------------------

TEXT = "def f(x):\n\treturn x  # héllo wörld ✓ 日本語 🙂\n\n"


def test_byte_tokenizer_round_trip():
    tok = tokenizers.ByteTokenizer()
    ids = tok.encode(TEXT)
    assert ids.dtype == np.int32 and tok.vocab_size == 259
    assert len(ids) == len(TEXT.encode()) and ids.min() >= 3 and ids.max() < 259
    assert tok.decode(ids) == TEXT
    assert tok.decode(np.concatenate([[tok.bos_id], ids, [tok.eos_id, tok.pad_id]])) == TEXT
    assert np.array_equal(tok.encode(TEXT.encode()), ids)


def test_sentencepiece_trains_and_round_trips(data_cfg):
    src = corpus.load_split(data_cfg, "train")
    tok = tokenizers.train_sentencepiece((src[i]["text"] for i in range(20)), vocab_size=400)
    assert tok.vocab_size == 400 and (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    ids = tok.encode(TEXT)
    assert ids.dtype == np.int32 and ids.min() > 2 and ids.max() < 400
    assert tok.decode(ids) == TEXT  # non-ASCII goes through byte fallback
    for doc in (src[25]["text"].decode(), src[3]["text"].decode()):
        assert tok.decode(tok.encode(doc)) == doc
    sample = "".join(src[i]["text"].decode() for i in range(20))
    assert len(tok.encode(sample)) < 0.8 * len(sample.encode())  # it learned merges
    with pytest.raises(ConfigError, match="data.vocab_size"):
        tokenizers.train_sentencepiece([TEXT] * 10, vocab_size=100)


def test_get_tokenizer_caches_sentencepiece_and_rejects_unknown(data_cfg):
    cfg = _cfg(data_cfg, tokenizer="sentencepiece", vocab_size=512)
    first = tokenizers.get_tokenizer(cfg)
    assert os.path.exists(tokenizers.sentencepiece_path(cfg))
    again = tokenizers.get_tokenizer(cfg)
    assert again.vocab_size == 512 and np.array_equal(first.encode(TEXT), again.encode(TEXT))
    assert isinstance(tokenizers.get_tokenizer(data_cfg), tokenizers.ByteTokenizer)
    with pytest.raises(ConfigError, match="bytes, sentencepiece"):
        tokenizers.get_tokenizer(_cfg(data_cfg, tokenizer="chars"))


# ---- pipeline --------------------------------------------------------------------------------

def _rows(batches) -> dict[str, np.ndarray]:
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def _stream(rows: dict[str, np.ndarray]) -> np.ndarray:
    """The packed token stream: each row's T inputs plus its last target, padding dropped."""
    seg_NT = rows["segment_ids"]
    full = np.concatenate([rows["inputs"], rows["targets"][:, -1:]], axis=1)
    last_real_N1 = (seg_NT[:, -1:] > 0) & (rows["targets"][:, -1:] != 0)  # 0 = pad, never a real token
    real = np.concatenate([seg_NT > 0, last_real_N1], axis=1)
    return full[real]


def _documents(stream: np.ndarray, bos: int) -> list[bytes]:
    starts = np.flatnonzero(stream == bos)
    return [stream[a:b].tobytes() for a, b in zip(starts, list(starts[1:]) + [len(stream)])]


def _expected_documents(cfg, split) -> list[bytes]:
    """bos + tokens + eos of every non-empty record of `split`, in record order (tokenized here)."""
    tok = tokenizers.get_tokenizer(cfg)
    src = corpus.load_split(cfg, split)
    bos, eos = [tok.bos_id], [tok.eos_id]
    return [np.concatenate([bos, tok.encode(src[i]["text"]), eos]).astype(np.int32).tobytes()
            for i in range(len(src)) if src[i]["text"]]


def test_packing_reconstructs_documents_with_consistent_metadata(data_cfg):
    cfg = _cfg(data_cfg, seq_len=64)
    batches = list(pipeline.make_lm_iterator(cfg, split="validation", global_batch_size=8, seed=0,
                                             shuffle=False, repeat=False))
    assert all(b["inputs"].shape == (8, 64) for b in batches)
    assert {k: v.dtype for k, v in batches[0].items()} == {
        "inputs": np.int32, "targets": np.int32, "segment_ids": np.int32, "positions": np.int32,
        "weights": np.float32}
    rows = _rows(batches)
    seg, pos, w = rows["segment_ids"], rows["positions"], rows["weights"]
    # only the very last rows may hold padding, and padding is at the end of its row
    padded = np.flatnonzero((seg == 0).any(axis=1))
    assert padded.size <= 8 and (padded.size == 0 or padded.min() >= len(seg) - 8)
    for r in range(len(seg)):
        s, p = seg[r], pos[r]
        real = s > 0
        assert real[: real.sum()].all()  # padding only after the real tokens
        if not real.any():
            continue  # an all-padding row filling up the last batch
        assert s[0] == 1 and (np.diff(s[real]) >= 0).all() and (np.diff(s[real]) <= 1).all()
        new_segment = np.concatenate([[True], s[1:] != s[:-1]])
        expected_pos = np.arange(64) - np.maximum.accumulate(np.where(new_segment, np.arange(64), 0))
        assert np.array_equal(p[real], expected_pos[real])
    # weights: 1 exactly where the target continues the same document inside the row
    assert (w[seg == 0] == 0).all()
    assert (w[rows["targets"] == 1] == 0).all()        # never predict the next document's bos
    assert (w[rows["inputs"] == 2] == 0).all()          # nothing after eos
    same_next = np.concatenate([seg[:, 1:] == seg[:, :-1], np.ones((len(seg), 1), bool)], axis=1)
    assert np.array_equal(w[:, :-1] > 0, ((seg > 0) & same_next)[:, :-1])
    assert np.array_equal(rows["targets"][:, :-1], rows["inputs"][:, 1:])
    # long documents continue across rows (a row starting mid-document), and nothing is lost
    assert (rows["inputs"][:, 0] != 1).any()
    assert _documents(_stream(rows), bos=1) == _expected_documents(cfg, "validation")


def test_process_shards_are_row_slices_of_the_global_batch(data_cfg):
    """Process p of n reads rows [p·B, (p+1)·B) of the same global batch: the batches of a step do not
    depend on the process count (train split, shuffled, across an epoch boundary of the eval split)."""
    for split, steps in (("train", 3), ("validation", 110)):
        cfg = _cfg(data_cfg, seq_len=64 if split == "train" else 1023)
        kw = dict(split=split, global_batch_size=8, seed=0)
        one = pipeline.make_lm_iterator(cfg, **kw)
        quarters = [pipeline.make_lm_iterator(cfg, process_index=p, process_count=4, **kw) for p in range(4)]
        for _ in range(steps):
            whole, parts = next(one), [next(q) for q in quarters]
            assert parts[0]["inputs"].shape == (2, cfg.seq_len)
            for k in whole:
                np.testing.assert_array_equal(whole[k], np.concatenate([p[k] for p in parts]), err_msg=k)
    eval_tokens = token_cache.read_meta(token_cache.cache_path(cfg, tokenizers.ByteTokenizer()))["eval"]["tokens"]
    assert steps * 8 * 1024 > eval_tokens  # the second epoch of the eval split was reached
    with pytest.raises(ConfigError, match="train.batch_size=7.*process count"):
        pipeline.make_lm_iterator(cfg, split="validation", global_batch_size=7, seed=0, process_count=2)


@pytest.mark.parametrize("task", ["mlm", "span_corruption", "classify"])
def test_task_batches_do_not_depend_on_the_process_count(task, data_cfg):
    """Masking and span noise draw per global row, classification snippets are global rows too: two
    processes' batches are the rows of one process's, and a restored iterator continues the same way."""
    from transformer.data import classification, mlm, span_corruption

    cfg = _cfg(data_cfg, seq_len=64, noise_density=0.15, mean_noise_span_length=3.0)
    make = {"mlm": mlm.make_mlm_iterator, "span_corruption": span_corruption.make_span_corruption_iterator,
            "classify": classification.make_classification_iterator}[task]
    kw = dict(split="train", global_batch_size=8, seed=4)
    one = make(cfg, **kw)
    halves = [make(cfg, process_index=p, process_count=2, **kw) for p in range(2)]
    for _ in range(3):
        whole, parts = next(one), [next(h) for h in halves]
        for k in whole:
            np.testing.assert_array_equal(whole[k], np.concatenate([p[k] for p in parts]), err_msg=k)
    resumed = make(cfg, process_index=1, process_count=2, **kw)
    resumed.set_state(json.loads(json.dumps(one.get_state())))
    after, again = next(one), next(resumed)
    for k in after:
        np.testing.assert_array_equal(after[k][4:], again[k], err_msg=k)


def test_tfds_split_is_tokenized_once_into_a_cache_next_to_the_dataset(data_cfg):
    cfg = _cfg(data_cfg, seq_len=64)
    path = token_cache.ensure_cache(cfg, tokenizers.ByteTokenizer(), verbose=False)
    assert os.path.dirname(os.path.dirname(path)) == cfg.data_dir  # <data_dir>/tokens/<key>
    meta = token_cache.read_meta(path)
    built = os.stat(os.path.join(path, "meta.json")).st_mtime_ns
    next(pipeline.make_lm_iterator(cfg, split="validation", global_batch_size=4, seed=0))
    assert os.stat(os.path.join(path, "meta.json")).st_mtime_ns == built  # read, not rebuilt
    src = corpus.load_split(cfg, "validation")
    texts = [src[i]["text"] for i in range(len(src)) if src[i]["text"]]
    assert meta["eval"]["documents"] == len(texts) and meta["eval"]["bytes"] == sum(map(len, texts))
    assert meta["eval"]["tokens"] == sum(map(len, texts)) + 2 * len(texts)  # bytes: one token each, + bos, eos
    cached = token_cache.open_split(path, "eval")
    assert [cached.tokens[a:b].astype(np.int32).tobytes() for a, b in zip(cached.offsets[:-1], cached.offsets[1:])] \
        == _expected_documents(cfg, "validation")
    # another split choice or tokenizer: another cache
    assert token_cache.cache_path(_cfg(cfg, train_split="validation", eval_split="train"), tokenizers.ByteTokenizer()) != path
    sp = tokenizers.get_tokenizer(_cfg(cfg, tokenizer="sentencepiece", vocab_size=512))
    assert token_cache.cache_path(cfg, sp) != path


def test_eval_batches_identical_across_calls(data_cfg):
    """Evaluation itself (the one evaluation.Evaluator a run keeps), twice: it feeds the eval step the same
    train.eval_steps batches at every evaluation (distinct batches of the eval split), so its results agree."""
    from configs import lm
    from transformer.tasks import get_task
    from transformer.training import sharding
    from transformer.training.evaluation import Evaluator

    c = lm.get_config("gpt2_tiny")
    c.data.data_dir, c.data.seq_len = data_cfg.data_dir, 64
    c.train.batch_size, c.train.eval_steps = 8, 3
    mesh = sharding.make_mesh(c.mesh)
    batch_sharding = sharding.batch_sharding(mesh, sharding.rules(c.mesh))
    fed: list[list[dict[str, np.ndarray]]] = []

    def eval_fn(params, batch):  # records each global batch; its sums depend on every target it was fed
        host = {k: np.asarray(v) for k, v in batch.items()}
        fed[-1].append(host)
        w = host["weights"]
        return {"loss_sum": np.float32(np.sum(host["targets"] * w)), "weight_sum": np.float32(np.sum(w)),
                "correct_sum": np.float32(np.sum(host["inputs"][:, 0]))}

    results, evaluator = [], Evaluator(eval_fn, get_task(c), c, batch_sharding, 0, 1)
    try:
        for _ in range(2):
            fed.append([])
            results.append(evaluator(None))
    finally:
        evaluator.close()
    first, second = fed
    assert len(first) == len(second) == 3 and first[0]["inputs"].shape == (8, 64)
    assert not np.array_equal(first[0]["inputs"], first[1]["inputs"])  # three batches, not one thrice
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(first, second) for k in a)
    assert results[0] == results[1]


def test_shuffle_is_seeded(data_cfg):
    cfg = _cfg(data_cfg, seq_len=64)
    first = lambda seed: next(pipeline.make_lm_iterator(cfg, split="train", global_batch_size=4, seed=seed))
    assert np.array_equal(first(3)["inputs"], first(3)["inputs"])
    assert not np.array_equal(first(3)["inputs"], first(4)["inputs"])


def test_iterator_resume_gives_identical_batches(data_cfg, tmp_path):
    import orbax.checkpoint as ocp
    cfg = _cfg(data_cfg, seq_len=64)
    make = lambda: pipeline.make_lm_iterator(cfg, split="train", global_batch_size=4, seed=0)
    it = make()
    for _ in range(7):
        next(it)
    state = it.get_state()
    mngr = ocp.CheckpointManager(str(tmp_path / "ckpt"))
    mngr.save(7, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    mngr.wait_until_finished()
    expected = [next(it) for _ in range(3)]
    for restore in ("set_state", "orbax"):
        fresh = make()
        if restore == "set_state":
            fresh.set_state(json.loads(json.dumps(state)))
        else:
            mngr.restore(7, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
        got = [next(fresh) for _ in range(3)]
        assert all(np.array_equal(a[k], b[k]) for a, b in zip(expected, got) for k in a), restore
    mngr.close()
    with pytest.raises(ValueError, match="not a global batch index.*older version"):
        make().set_state({"next_index": 7})  # a per-process position from before: refused, not misread


def test_worker_processes_give_the_same_batches_from_a_restored_position(data_cfg):
    """grain worker processes compute batch s from its global index: the same batches as in-process
    reading, in the same order, starting at a restored position."""
    cfg = _cfg(data_cfg, seq_len=256)
    kw = dict(split="validation", global_batch_size=8, seed=0, shuffle=True, repeat=True)
    local = pipeline.make_lm_iterator(cfg, **kw)
    expected = [next(local) for _ in range(6)][2:]
    workers = pipeline.make_lm_iterator(_cfg(cfg, worker_count=2), **kw)
    workers.set_state(json.loads(json.dumps({"next_batch": 2})))
    try:
        got = [next(workers) for _ in range(4)]
    finally:
        workers.close()
    assert workers.get_state() == {"next_batch": 6}
    for a, b in zip(expected, got):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_unigram_entropy(data_cfg):
    h = pipeline.unigram_entropy(data_cfg, "validation", max_tokens=200_000)
    assert 2.0 < h < math.log(100)  # source code: far from uniform over bytes, far from constant
    docs = _expected_documents(data_cfg, "validation")
    stream = np.concatenate([np.frombuffer(d, np.int32)[1:] for d in docs])  # targets: no bos
    p = np.bincount(stream[:200_000]) / 200_000
    assert h == pytest.approx(-np.sum(p[p > 0] * np.log(p[p > 0])), rel=1e-9)
