"""Local files as training data: sources, tokenizer files, the token cache, packing by global index."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import grain
import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from configs.common import base_config
from transformer.data import documents, packed, pipeline, token_cache, tokenizers
from transformer.spec import ConfigError

_WORDS = ("the model reads tokens from files and learns to predict the next one while the loss falls "
          "slowly over many steps of training on text written by people").split()


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(_WORDS, int(rng.integers(3, 40)))) + "." for _ in range(n)]


def write_mixed_folder(folder: str, texts: list[str]) -> None:
    """texts spread over .jsonl, .jsonl.gz, .parquet and .txt files (in that sorted order: a, b, c, d*)."""
    os.makedirs(folder, exist_ok=True)
    q = len(texts) // 4
    with open(os.path.join(folder, "a.jsonl"), "w") as f:
        for t in texts[:q]:
            f.write(json.dumps({"text": t, "id": 1}) + "\n")
    with gzip.open(os.path.join(folder, "b.jsonl.gz"), "wt") as f:
        for t in texts[q:2 * q]:
            f.write(json.dumps({"text": t}) + "\n")
    pq.write_table(pa.table({"text": texts[2 * q:3 * q], "n": list(range(q))}), os.path.join(folder, "c.parquet"))
    for i, t in enumerate(texts[3 * q:]):
        with open(os.path.join(folder, f"d{i:03d}.txt"), "w") as f:
            f.write(t)


def data_config(tmp_path, folder: str, **overrides) -> ml_collections.ConfigDict:
    cfg = base_config().data
    cfg.update(dict(files=os.path.join(folder, "*"), eval_fraction=0.25, cache_dir=str(tmp_path / "cache"),
                    seq_len=16))
    cfg.update(overrides)
    return cfg


def train_hf_tokenizer(path: str, texts: list[str]) -> None:
    """A GPT-2-style byte-level BPE tokenizer.json (only special token: <|endoftext|>), tiny vocab."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)


def train_sp_model(path: str, texts: list[str]) -> None:
    """A LLaMA-style SentencePiece model (unk/bos/eos = 0/1/2, no pad piece)."""
    import sentencepiece as spm

    with open(path, "wb") as f:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=f, vocab_size=320,
                                       model_type="bpe", byte_fallback=True, hard_vocab_limit=False, minloglevel=2)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("mytext"))
    write_mixed_folder(path, _texts(80))
    return path


# ---- sources -----------------------------------------------------------------------------------

def test_documents_read_every_format_and_hold_out_by_content(folder, tmp_path):
    cfg = data_config(tmp_path, folder)
    train, held = list(documents.iter_split(cfg, "train")), list(documents.iter_split(cfg, "eval"))
    assert sorted(train + held) == sorted(_texts(80))  # every document of every format, once
    assert held and train and not set(held) & set(train)
    assert all(documents.is_held_out(t, 0.25) for t in held)
    # the same document is held out wherever it sits: the rule reads the content only
    moved = tmp_path / "moved"
    write_mixed_folder(str(moved), _texts(80)[::-1])
    assert sorted(documents.iter_split(data_config(tmp_path, str(moved)), "eval")) == sorted(held)


def test_packing_matches_grain_concat_then_split(folder, tmp_path):
    """Rows packed from the cache equal grain's ConcatThenSplit packing of the same documents."""
    cfg = data_config(tmp_path, folder)
    tok = tokenizers.ByteTokenizer()
    path = token_cache.ensure_cache(cfg, tok, verbose=False)
    docs = [np.concatenate([[tok.bos_id], tok.encode(t), [tok.eos_id]]).astype(np.int32)
            for t in documents.iter_split(cfg, "train")]
    source = grain.MapDataset.source([{"tokens": d} for d in docs])
    expected = [pipeline.lm_features(r["tokens"], r["tokens_segment_ids"], r["tokens_positions"])
                for r in grain.experimental.ConcatThenSplitIterDataset(source.to_iter_dataset(),
                                                                       length_struct={"tokens": 17})]
    rows = packed.PackedRows(path, "train", 17, seed=0, shuffle=False, repeat=False)
    assert rows.num_rows == len(expected)
    r = rows.rows(0, len(expected))
    got = pipeline.lm_features(r["tokens"], r["segment_ids"], r["positions"])
    for i, row in enumerate(expected):
        for key, value in row.items():
            np.testing.assert_array_equal(got[key][i], value, err_msg=f"row {i} {key}")


def test_shuffled_epochs_are_whole_permutations_of_the_documents(folder, tmp_path):
    """Rows read across several shuffled epochs (one read spanning them all): each epoch of the stream is every
    document once, whole, in its own order; segment ids and positions restart exactly at document starts."""
    cfg = data_config(tmp_path, folder)
    tok = tokenizers.ByteTokenizer()
    path = token_cache.ensure_cache(cfg, tok, verbose=False)
    docs = sorted(np.concatenate([[1], tok.encode(t), [2]]).astype(np.int32).tobytes()
                  for t in documents.iter_split(cfg, "train"))
    rows = packed.PackedRows(path, "train", 17, seed=5, shuffle=True, repeat=True)
    S = rows.total_tokens
    count = -(-7 * S // (2 * 17))  # 3.5 epochs
    r = rows._stream_rows(3, count)  # from stream row 3 (token 51): the read starts inside epoch 0
    stream = r["tokens"].ravel()
    orders = []
    for e in (1, 2):               # the epochs read whole: stream tokens [e·S, (e+1)·S)
        epoch = stream[e * S - 51:(e + 1) * S - 51]
        starts = np.flatnonzero(epoch == 1)
        assert starts[0] == 0      # an epoch starts with a document
        pieces = [epoch[a:b].tobytes() for a, b in zip(starts, list(starts[1:]) + [len(epoch)])]
        assert sorted(pieces) == docs
        orders.append(pieces)
    assert orders[0] != orders[1]  # each epoch in its own order
    seg, pos = r["segment_ids"], r["positions"]
    starts_CR = r["tokens"] == 1
    assert (seg > 0).all()
    new_CR = np.concatenate([np.ones((count, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
    assert np.array_equal(new_CR[:, 1:], starts_CR[:, 1:])  # a new segment exactly where a document starts
    assert (pos[starts_CR] == 0).all() and (pos[:, 0] == 0).all()
    assert (np.diff(pos, axis=1)[~new_CR[:, 1:]] == 1).all()


def test_shuffled_rows_are_read_in_a_seeded_order_block_by_block(folder, tmp_path):
    """Shuffled, each block of M = num_rows stream rows is read once, in its own seeded order: a batch's rows
    come from all over the stream, not from one stretch of it (consecutive rows are mostly one document)."""
    cfg = data_config(tmp_path, folder)
    path = token_cache.ensure_cache(cfg, tokenizers.ByteTokenizer(), verbose=False)
    rows = packed.PackedRows(path, "train", 17, seed=5, shuffle=True, repeat=True)
    M = rows.num_rows
    as_set = lambda r: sorted(x.tobytes() for x in np.concatenate([r["tokens"], r["segment_ids"], r["positions"]], 1))
    for b in (0, 1):
        read, stream = rows.rows(b * M, M), rows._stream_rows(b * M, M)
        assert as_set(read) == as_set(stream)                         # every stream row of the block once
        assert not np.array_equal(read["tokens"], stream["tokens"])   # ... not in stream order
    first = rows.rows(0, 8)["tokens"]
    order0 = [int(np.flatnonzero([np.array_equal(first[i], row) for row in rows._stream_rows(0, M)["tokens"]])[0])
              for i in range(8)]
    assert np.ptp(order0) > M // 4                                     # a batch spans the corpus
    again = packed.PackedRows(path, "train", 17, seed=5, shuffle=True, repeat=True).rows(0, 8)["tokens"]
    other = packed.PackedRows(path, "train", 17, seed=6, shuffle=True, repeat=True).rows(0, 8)["tokens"]
    assert np.array_equal(first, again) and not np.array_equal(first, other)


def test_batches_are_global_rows_split_across_processes(folder, tmp_path):
    cfg = data_config(tmp_path, folder, eval_fraction=0.25)
    kw = dict(split="train", global_batch_size=4, seed=3)
    one = pipeline.make_lm_iterator(cfg, **kw)
    halves = [pipeline.make_lm_iterator(cfg, process_index=p, process_count=2, **kw) for p in range(2)]
    for _ in range(12):  # several epochs: 12 batches x 4 rows x 17 > the train split's tokens
        b1, parts = next(one), [next(h) for h in halves]
        for key in b1:
            np.testing.assert_array_equal(b1[key], np.concatenate([p[key] for p in parts]))
    state = one.get_state()
    after = next(one)
    resumed = pipeline.make_lm_iterator(cfg, **kw)
    resumed.set_state(json.loads(json.dumps(state)))  # the state is small and survives JSON
    np.testing.assert_array_equal(next(resumed)["inputs"], after["inputs"])
    # every epoch is a permutation of the documents: the seed changes the order, not the tokens
    rows_a = packed.PackedRows(token_cache.cache_path(cfg, tokenizers.ByteTokenizer()), "train", 17, 1, True, True)
    rows_b = packed.PackedRows(rows_a._args[0], "train", 17, 2, True, True)
    n = rows_a.total_tokens // 17
    ta, tb = rows_a.rows(0, n)["tokens"], rows_b.rows(0, n)["tokens"]
    assert not np.array_equal(ta, tb)
    assert abs(np.bincount(ta.ravel(), minlength=259) - np.bincount(tb.ravel(), minlength=259)).sum() <= 2 * 17


# ---- tokenizer files and training --------------------------------------------------------------

@pytest.mark.parametrize("kind", ["tokenizer.json", pytest.param("sentencepiece.model", marks=pytest.mark.slow)])  # CI's 15 minutes (2026-11-27): 15 s
def test_train_on_mixed_files_with_a_tokenizer_file(kind, folder, tmp_path):
    from configs.lm import get_config
    from transformer.training.loop import train
    from transformer.training.restore import load_run

    tok_path = str(tmp_path / "src" / kind)
    os.makedirs(os.path.dirname(tok_path))
    (train_hf_tokenizer if kind.endswith(".json") else train_sp_model)(tok_path, _texts(200, seed=1))
    tok = tokenizers.get_tokenizer(ml_collections.ConfigDict({"tokenizer": tok_path}))
    if kind.endswith(".json"):  # GPT-2 style: <|endoftext|> is bos, eos and pad
        assert tok.bos_id == tok.eos_id == tok.pad_id == 0
    else:  # LLaMA style: bos 1, eos 2, no pad piece
        assert (tok.bos_id, tok.eos_id) == (1, 2)
    config = get_config("gpt2_tiny")
    config.data = data_config(tmp_path, folder, tokenizer=tok_path)
    config.train.update(steps=3, warmup_steps=1, batch_size=8, eval_every=3, eval_steps=1, checkpoint_every=3,
                        log_every=1)
    workdir = str(tmp_path / "run")
    summary = train(config, workdir, verbose=False)
    assert summary["status"] == "ok" and np.isfinite(summary["eval_loss"])
    with open(os.path.join(workdir, "config.json")) as f:
        resolved = json.load(f)
    assert resolved["data"]["tokenizer_fingerprint"] == tok.fingerprint
    assert resolved["model"]["vocab_size"] == -(-tok.vocab_size // 128) * 128
    meta = token_cache.read_meta(token_cache.cache_path(config.data, tok))
    assert (meta["bos_id"], meta["eos_id"]) == (tok.bos_id, tok.eos_id)
    # accounting: the split's tokens and passes over them; bits per byte of the evaluated targets
    assert summary["train_split_tokens"] == meta["train"]["tokens"]
    assert summary["epochs"] == pytest.approx(3 * 8 * (16 + 1) / meta["train"]["tokens"], rel=1e-12)  # rows of T + 1
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        assert json.loads(f.readlines()[-1])["eval_bits_per_byte"] == summary["eval_bits_per_byte"]
    if kind.endswith(".json"):  # the eval batch, its targets' bytes as the tokenizer decodes them one by one
        batch = next(pipeline.make_lm_iterator(config.data, split=config.data.eval_split, global_batch_size=8,
                                               seed=config.data.shuffle_seed))
        w = batch["weights"].ravel()
        target_bytes = np.sum(_decoded_bytes(tok, batch["targets"].ravel()) * w)
        assert summary["eval_bits_per_byte"] == pytest.approx(
            summary["eval_loss"] * w.sum() / (np.log(2) * target_bytes), rel=1e-5)
    cached = token_cache.open_split(token_cache.cache_path(config.data, tok), "train")
    first = next(documents.iter_split(config.data, "train"))
    np.testing.assert_array_equal(cached.tokens[1:cached.offsets[1] - 1], tok.encode(first))
    # the run needs nothing outside its workdir: the tokenizer file is gone, sampling still decodes
    os.remove(tok_path)
    run = load_run(workdir)
    assert run.tokenizer.fingerprint == tok.fingerprint
    assert run.tokenizer.decode(run.tokenizer.encode(first)) == first


# ---- the cache ---------------------------------------------------------------------------------

def test_cache_invalidated_when_a_file_changes(tmp_path):
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(40))
    cfg = data_config(tmp_path, folder)
    tok = tokenizers.ByteTokenizer()
    old = token_cache.ensure_cache(cfg, tok, verbose=False)
    assert token_cache.ensure_cache(cfg, tok, verbose=False) == old  # unchanged files: the same cache
    path = os.path.join(folder, "d000.txt")
    st = os.stat(path)
    text = open(path).read()
    with open(path, "w") as f:  # same size, same mtime: only the content hash can tell
        f.write(text[::-1])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    new = token_cache.ensure_cache(cfg, tok, verbose=False)
    assert new != old
    all_tokens = np.concatenate([token_cache.open_split(new, s).tokens for s in token_cache.SPLITS])
    assert (all_tokens[np.isin(all_tokens, [1, 2], invert=True)] - 3).astype(np.uint8).tobytes().find(text[::-1].encode()) >= 0
    other = tokenizers.SentencePieceTokenizer(open(_sp_file(tmp_path), "rb").read())
    assert token_cache.cache_path(cfg, other) not in (old, new)  # another tokenizer: another cache


def _sp_file(tmp_path) -> str:
    path = str(tmp_path / "sp.model")
    if not os.path.exists(path):
        train_sp_model(path, _texts(200, seed=2))
    return path


@pytest.mark.slow
def test_half_written_cache_is_never_used(tmp_path):
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(40))
    cfg = data_config(tmp_path, folder)
    # a process killed just before its rename: everything written except the final move
    script = (
        "import os, sys, ml_collections\n"
        "from transformer.data import token_cache, tokenizers\n"
        "os.rename = lambda *a: os._exit(9)\n"
        f"token_cache.ensure_cache(ml_collections.ConfigDict({cfg.to_dict()!r}), tokenizers.ByteTokenizer())\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    assert subprocess.run([sys.executable, "-c", script], env=env, capture_output=True).returncode == 9
    tok = tokenizers.ByteTokenizer()
    final = token_cache.cache_path(cfg, tok)
    root = os.path.dirname(final)
    leftovers = [n for n in os.listdir(root) if ".tmp-" in n]
    assert leftovers and not os.path.exists(final)
    # a directory at the final name without meta.json (e.g. copied in part) is rebuilt, not read
    os.makedirs(final)
    with open(os.path.join(final, "train.tokens"), "wb") as f:
        f.write(b"\x00" * 10)
    assert token_cache.ensure_cache(cfg, tok, verbose=False) == final
    meta = token_cache.read_meta(final)
    split = token_cache.open_split(final, "train")
    assert len(split.tokens) == meta["train"]["tokens"] == split.offsets[-1] > 10
    assert split.tokens[0] == tok.bos_id


# ---- bad input ---------------------------------------------------------------------------------

def _bad_folder(tmp_path, case: str) -> tuple[dict, str]:
    d = tmp_path / "bad"
    d.mkdir()
    good = json.dumps({"text": "fine"}) + "\n"
    if case == "glob":
        return dict(files=str(d / "*.jsonl")), "matches no file"
    if case == "extension":
        (d / "x.csv").write_text("a,b\n")
        return dict(files=str(d / "*")), "x.csv has an unknown extension"
    if case == "not_json":
        (d / "x.jsonl").write_text(good + "{not json\n")
        return dict(files=str(d / "*")), "x.jsonl line 2 is not JSON"
    if case == "no_field":
        (d / "x.jsonl").write_text(good + json.dumps({"body": "no text"}) + "\n")
        return dict(files=str(d / "*")), "x.jsonl line 2 has no field data.text_feature='text'"
    if case == "parquet_column":
        pq.write_table(pa.table({"body": ["a"]}), str(d / "x.parquet"))
        return dict(files=str(d / "*")), "x.parquet has no column data.text_feature='text'; its columns: body"
    if case == "no_documents":
        (d / "x.txt").write_text("")
        return dict(files=str(d / "*")), "holds no documents"
    if case == "empty_eval":
        (d / "x.jsonl").write_text(good * 3)
        return dict(files=str(d / "*"), eval_fraction=1e-12), "eval split is empty: data.eval_fraction"
    (d / "x.jsonl").write_text(good)
    if case == "tokenizer_missing":
        return dict(files=str(d / "*"), tokenizer=str(d / "nope.json")), "data.tokenizer=.*no such file"
    if case == "tokenizer_json_garbage":
        (d / "tok.json").write_text('{"not": "a tokenizer"}')
        return dict(files=str(d / "*"), tokenizer=str(d / "tok.json")), "is not a Hugging Face tokenizer.json"
    if case == "tokenizer_model_garbage":
        (d / "tok.model").write_bytes(b"garbage")
        return dict(files=str(d / "*"), tokenizer=str(d / "tok.model")), "is not a SentencePiece model"
    if case == "cache_unwritable":
        (d / "afile").write_text("")
        return dict(files=str(d / "*.jsonl"), cache_dir=str(d / "afile" / "cache")), "cannot write the token cache"
    raise AssertionError(case)


BAD_CASES = ["glob", "extension", "not_json", "no_field", "parquet_column", "no_documents", "empty_eval",
             "tokenizer_missing", "tokenizer_json_garbage", "tokenizer_model_garbage", "cache_unwritable"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_one_clear_error_before_training(case, tmp_path):
    from configs.lm import get_config
    from transformer.training.loop import train

    overrides, message = _bad_folder(tmp_path, case)
    config = get_config("gpt2_tiny")
    config.data.update({"cache_dir": str(tmp_path / "cache"), "seq_len": 16, **overrides})
    config.train.update(steps=2, warmup_steps=1, batch_size=8)
    workdir = tmp_path / "existing_run"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=message):
        train(config, str(workdir), verbose=False)
    assert sorted(os.listdir(workdir)) == ["notes.txt"]  # the workdir is untouched
    cache = tmp_path / "cache" / "tokens"
    assert not cache.exists() or not [n for n in os.listdir(cache) if not n.endswith(".lock")]


def test_tokenizer_larger_than_explicit_vocab_size(tmp_path, folder):
    from configs.lm import get_config
    from transformer.training.loop import train

    tok_path = str(tmp_path / "tokenizer.json")
    train_hf_tokenizer(tok_path, _texts(200))
    config = get_config("gpt2_tiny")
    config.data = data_config(tmp_path, folder, tokenizer=tok_path)
    config.model.vocab_size = 256  # the tokenizer has 300
    with pytest.raises(ConfigError, match="model.vocab_size=256 is smaller than the tokenizer's vocabulary"):
        train(config, str(tmp_path / "run"), verbose=False)
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


# ---- what a new user met (issue 15, item 8) ----------------------------------------------------

def test_a_folder_of_text_as_data_dir_or_tfds_name_says_use_data_files(tmp_path):
    from transformer.data import corpus

    mytext = tmp_path / "mytext"
    mytext.mkdir()
    (mytext / "notes.txt").write_text("my own words")
    cfg = base_config().data
    cfg.data_dir = str(mytext)
    with pytest.raises(ConfigError, match=r"holds your own files \(notes.txt\).*data.files="):
        corpus.load_split(cfg, "train")
    assert sorted(os.listdir(mytext)) == ["notes.txt"]  # no corpus built inside it
    cfg = base_config().data
    cfg.tfds_name = str(mytext)
    with pytest.raises(ConfigError, match="is a path, not a TFDS dataset name.*data.files=") as e:
        corpus.load_split(cfg, "train")
    assert "\n" not in str(e.value)
    cfg = base_config().data
    cfg.update(tfds_name="no_such_dataset", data_dir=str(tmp_path / "tfds"))
    with pytest.raises(ConfigError) as e:
        corpus.load_split(cfg, "train")
    assert "\n" not in str(e.value)


def test_corpus_build_prints_no_tfds_noise(tmp_path, capfd):
    from transformer.data import corpus

    cfg = base_config().data
    cfg.data_dir = str(tmp_path / "tfds")
    corpus.load_split(cfg, "validation")
    out, err = capfd.readouterr()
    assert "Built stdlib_py" in out
    assert "Downloading and preparing" not in out + err
    assert "\x1b[A" not in out + err and "dataset_info.json" not in err


def test_prepare_data_cli(folder, tmp_path):
    cfg = data_config(tmp_path, folder)
    cmd = [sys.executable, "-m", "experiments.prepare_data", "--config=configs/lm.py:gpt2_tiny",
           f"--config.data.files={cfg.files}", f"--config.data.cache_dir={cfg.cache_dir}",
           "--config.data.eval_fraction=0.25"]
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "tokens/s" in done.stdout + done.stderr
    assert result["cache"] == token_cache.cache_path(cfg, tokenizers.ByteTokenizer())
    meta_mtime = os.stat(os.path.join(result["cache"], "meta.json")).st_mtime_ns
    assert token_cache.ensure_cache(cfg, tokenizers.ByteTokenizer(), verbose=False) == result["cache"]
    assert os.stat(os.path.join(result["cache"], "meta.json")).st_mtime_ns == meta_mtime  # read, not rebuilt
    assert result["train"]["documents"] + result["eval"]["documents"] == 80
    # a sweep config: its base.data
    sweep = [c.replace("--config.data.", "--config.base.data.") for c in cmd]
    sweep[sweep.index("--config=configs/lm.py:gpt2_tiny")] = "--config=configs/sweeps/quick.py"
    done = subprocess.run(sweep, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["cache"] == result["cache"]


def test_unigram_entropy_of_cached_files_counts_tokens_and_eos(folder, tmp_path):
    import scipy.stats

    cfg = data_config(tmp_path, folder)
    tok = tokenizers.ByteTokenizer()
    ids = np.concatenate([np.append(tok.encode(t), tok.eos_id) for t in documents.iter_split(cfg, "train")])
    expected = scipy.stats.entropy(np.bincount(ids, minlength=tok.vocab_size))
    assert pipeline.unigram_entropy(cfg, cfg.train_split) == pytest.approx(expected, rel=1e-12)
    assert pipeline.unigram_entropy(cfg, cfg.train_split, max_tokens=50) == pytest.approx(
        scipy.stats.entropy(np.bincount(ids[:50], minlength=tok.vocab_size)), rel=1e-12)


@pytest.mark.slow  # CI's time (the default run is at its 15 minutes); -m slow runs it
def test_resume_on_files_equals_uninterrupted(folder, tmp_path):
    """The cache iterator's position (next batch index) goes through the checkpoint and back."""
    from configs.lm import get_config
    from transformer.training.loop import train
    from transformer.training.metrics import read_metrics

    config = get_config("gpt2_tiny")
    config.data = data_config(tmp_path, folder)
    config.train.update(steps=4, warmup_steps=1, batch_size=8, eval_every=4, eval_steps=1, checkpoint_every=2,
                        log_every=1)
    whole = train(config, str(tmp_path / "whole"), verbose=False)
    assert train(config, str(tmp_path / "split"), verbose=False, stop_at=2)["status"] == "preempted"
    resumed = train(config, str(tmp_path / "split"), verbose=False)
    assert resumed["status"] == "ok" and resumed["eval_loss"] == pytest.approx(whole["eval_loss"], rel=1e-6)
    losses = lambda d: [r["train_loss"] for r in read_metrics(str(d)) if "train_loss" in r]  # noqa: E731
    np.testing.assert_allclose(losses(tmp_path / "split")[-2:], losses(tmp_path / "whole")[-2:], rtol=1e-6)


# ---- accounting: bits per byte, epochs ---------------------------------------------------------------

def _tokenizer(kind: str, tmp_path) -> tokenizers.Tokenizer:
    if kind == "bytes":
        return tokenizers.ByteTokenizer()
    if kind == "tokenizer.json":
        path = str(tmp_path / "tokenizer.json")
        train_hf_tokenizer(path, _texts(200, seed=1))
        return tokenizers.load_tokenizer_file(path)
    if kind == "trained sentencepiece":  # identity normalisation, no dummy prefix (tokenizers.train_sentencepiece)
        return tokenizers.train_sentencepiece(_texts(200, seed=1), vocab_size=300)
    return tokenizers.load_tokenizer_file(_sp_file(tmp_path))  # LLaMA-style: a dummy-prefix space per document


@pytest.mark.parametrize("kind", ["bytes", "tokenizer.json", "trained sentencepiece", "llama-style .model"])
def test_token_byte_lengths_add_up_to_the_text(kind, folder, tmp_path):
    """Summed over every token of the cached eval split, byte_lengths() gives the UTF-8 bytes of its text as
    counted from the files (meta.json), exactly; a dummy-prefix SentencePiece model adds one per document."""
    tok = _tokenizer(kind, tmp_path)
    cfg = data_config(tmp_path, folder, tokenizer="bytes")
    path = token_cache.ensure_cache(cfg, tok, verbose=False)
    meta, cached = token_cache.read_meta(path)["eval"], token_cache.open_split(path, "eval")
    lengths_V = tok.byte_lengths()
    assert lengths_V.shape == (tok.vocab_size,) and lengths_V[[tok.bos_id, tok.eos_id]].tolist() == [0, 0]
    total = int(lengths_V[np.asarray(cached.tokens)].sum())
    assert total == meta["bytes"] + (meta["documents"] if kind == "llama-style .model" else 0)


def _decoded_bytes(tok: tokenizers.Tokenizer, ids) -> np.ndarray:
    """Each id's bytes as the tokenizer's own decoder writes it alone (exact for these ASCII texts)."""
    return np.array([len(tok.decode([int(i)]).encode("utf-8")) for i in ids], np.float64)


@pytest.mark.parametrize("kind", ["bytes", "tokenizer.json"])
def test_bits_per_byte_divides_the_loss_by_the_bytes_of_the_evaluated_targets(kind, folder, tmp_path):
    """A stand-in model that spends 0.7 nats per byte of each target token has 0.7 / ln 2 bits per byte with
    either tokenizer, though its loss per token differs; a denominator that counted the wrong tokens (unweighted
    targets, eos, the inputs) or tokens instead of bytes would not give that."""
    import jax

    from transformer.tasks.lm import LMTask
    from transformer.training.evaluation import Evaluator

    tok = _tokenizer(kind, tmp_path)
    setting = str(tmp_path / "tokenizer.json") if kind == "tokenizer.json" else "bytes"
    config = ml_collections.ConfigDict({"data": data_config(tmp_path, folder, tokenizer=setting, seq_len=32),
                                        "train": {"batch_size": 4, "eval_steps": 3}})
    seen = {"targets": 0.0}

    def eval_fn(params, batch):
        targets, weights = np.asarray(batch["targets"]), np.asarray(batch["weights"])
        seen["targets"] += weights.sum()
        nats = 0.7 * _decoded_bytes(tok, targets.ravel()).reshape(targets.shape)
        return {"loss_sum": np.sum(nats * weights), "weight_sum": weights.sum(), "correct_sum": 0.0}

    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    evaluator = Evaluator(eval_fn, LMTask(), config, sharding, 0, 1, tok.byte_lengths())
    got = evaluator(None)
    evaluator.close()
    assert got["eval_bits_per_byte"] == pytest.approx(0.7 / np.log(2), rel=1e-12)
    per_token = got["eval_loss"]  # nats per target token: 0.7 x the mean bytes per target
    assert per_token == pytest.approx(0.7, rel=0.05) if kind == "bytes" else per_token > 1.5 * 0.7
    assert seen["targets"] > 3 * 4 * 16  # three batches of mostly real targets were evaluated


def test_sweep_dry_run_shows_epochs_and_warns_where_the_data_repeats(folder, tmp_path, capsys):
    """experiments.sweep's dry-run table: epochs = D / the training split's tokens (from meta.json); `?` and how
    to get them while the data is not tokenized (the dry run tokenizes nothing); a warning above 1 epoch."""
    from transformer.sweeps.progress import print_table

    cfg = data_config(tmp_path, folder)
    def run(i: int, tokens: int) -> dict:
        return {"run_id": f"d{i}", "params": 1000, "tokens": tokens, "steps": 10, "batch_size": 8,
                "learning_rate": 1e-3, "flops": 6e3 * tokens, "estimated_seconds": 60.0,
                "config": {"data": cfg.to_dict()}}

    def epochs(out: str) -> list[str]:  # the epochs column of runs 0 and 1
        return [line.split()[4] for line in out.splitlines() if line.split()[:2] in (["0", "d0"], ["1", "d1"])]

    doc = {"name": "t", "mode": "isoflop", "notes": [], "estimated_seconds": 120.0,
           "runs": [run(0, 100), run(1, 10**5)],
           "sweep": {"estimate_flops_per_second": 1e9, "estimate_step_overhead_s": 0.01, "estimate_run_overhead_s": 5}}
    print_table(doc)
    out = capsys.readouterr().out
    assert epochs(out) == ["?", "?"] and "unknown until the data is tokenized" in out and "warning" not in out
    assert not os.path.exists(cfg.cache_dir)  # nothing built
    split_tokens = token_cache.read_meta(token_cache.ensure_cache(cfg, tokenizers.ByteTokenizer(), verbose=False))[
        "train"]["tokens"]
    T = cfg.seq_len  # D counts targets; a row of T targets reads T + 1 tokens of the split
    doc["runs"] = [run(0, split_tokens // 2), run(1, 2 * split_tokens)]  # about half an epoch; about 2 epochs
    print_table(doc)
    out = capsys.readouterr().out
    half, two = (split_tokens // 2) * (T + 1) / T / split_tokens, 2 * (T + 1) / T
    assert epochs(out) == [f"{half:.3g}", f"{two:.3g}"]
    assert f"warning: 1 runs see their training data more than once (up to {two:.2g} epochs)" in out
    assert "unknown" not in out
