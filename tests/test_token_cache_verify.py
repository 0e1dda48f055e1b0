"""The token cache is checked when a run opens it (issue 29, 1.6): meta.json records each file's size and SHA-256
when the cache is built; sizes are checked on every open, digests once per process (or on
experiments.prepare_data --verify), and a damaged cache is refused with one error naming the file and saying to
delete it to rebuild. A killed build's temporary directory is removed by the next build (2.6)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from test_data_files import _texts, data_config, write_mixed_folder

from transformer import file_claims
from transformer.data import identity, pipeline, token_cache, tokenizers
from transformer.spec import ConfigError, MissingInputError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def built(tmp_path):
    """(data config, its RunData, the built cache's path) on a small folder, bytes tokenizer."""
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(60))
    cfg = data_config(tmp_path, folder)
    data = identity.resolve_data(cfg, tokenizers.ByteTokenizer())
    return cfg, data, data.ensure_cache(verbose=False)


def _new_process() -> None:
    """What a new process knows about which caches it has verified: nothing (getattr: the same test ran on the code
    before the manifest)."""
    getattr(token_cache, "_VERIFIED", set()).clear()


def test_the_manifest_records_every_file_size_and_digest(built):
    _, _, path = built
    meta = token_cache.read_meta(path)
    assert sorted(meta[token_cache.MANIFEST_KEY]) == sorted(
        f"{s}.{kind}" for s in token_cache.SPLITS for kind in ("tokens", "offsets.npy"))
    for name, entry in meta[token_cache.MANIFEST_KEY].items():
        assert entry == token_cache._file_entry(os.path.join(path, name))
    assert token_cache.verify(path, digests=True) == meta


def test_flipped_bytes_in_eval_tokens_are_refused_not_evaluated(built):
    """Flipped bytes (same size) changed eval loss silently; now the next process to open the cache refuses it."""
    cfg, data, path = built
    tokens = os.path.join(path, "eval.tokens")
    with open(tokens, "r+b") as f:
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert data.ensure_cache(verbose=False) == path  # this process verified it already: digests once per process
    _new_process()
    with pytest.raises(ConfigError, match=rf"token cache {path} is damaged: eval.tokens does not hold the bytes .*"
                                          rf"delete it to rebuild"):
        pipeline.make_lm_iterator(cfg, split=cfg.eval_split, global_batch_size=4, seed=0, data=data)
    with pytest.raises(ConfigError, match="eval.tokens does not hold the bytes"):
        token_cache.verify(path, digests=True)  # --verify: whatever this process checked before


def test_a_truncated_train_tokens_is_refused_naming_it(built):
    """A truncated train.tokens was a bare IndexError deep in the packing."""
    cfg, data, path = built
    tokens = os.path.join(path, "train.tokens")
    size = os.path.getsize(tokens)
    with open(tokens, "r+b") as f:
        f.truncate(size // 2)
    message = rf"token cache {path} is damaged: train.tokens is {size // 2} bytes, {size} when it was built"
    with pytest.raises(ConfigError, match=message):
        data.ensure_cache(verbose=False)  # sizes: on every open
    with pytest.raises(ConfigError, match=message):
        token_cache.open_split(path, "train")  # a grain worker's open, too


def test_a_deleted_offsets_file_is_a_missing_input_naming_it(built):
    cfg, data, path = built
    os.remove(os.path.join(path, "train.offsets.npy"))
    with pytest.raises(MissingInputError, match=rf"token cache {path} is damaged: train.offsets.npy is missing; "
                                                rf"delete it to rebuild"):
        pipeline.make_lm_iterator(cfg, split=cfg.train_split, global_batch_size=4, seed=0, data=data)


def test_a_damaged_meta_json_is_refused(built):
    _, data, path = built
    with open(os.path.join(path, "meta.json"), "w") as f:
        f.write('{"dtype": "uint16", "trai')
    with pytest.raises(ConfigError, match=rf"token cache {path} is damaged: meta.json cannot be read"):
        data.ensure_cache(verbose=False)


def test_a_cache_copied_under_another_key_is_refused(built, tmp_path):
    """The cache's meta.json records the identity's fingerprints; they must give its directory's key."""
    _, _, path = built
    other = os.path.join(os.path.dirname(path), "0" * 24)
    os.rename(path, other)
    with pytest.raises(ConfigError, match=r"meta.json records the fingerprints of another cache"):
        token_cache.open_split(other, "train")


def test_a_cache_built_before_the_manifest_is_checked_by_its_counts(built):
    """Older caches have no manifest: sizes follow from meta.json's counts (truncation and deleted files are
    found); an explicit verification is refused (no digests: rebuild it)."""
    cfg, data, path = built
    meta = token_cache.read_meta(path)
    del meta[token_cache.MANIFEST_KEY]
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(meta, f)
    _new_process()
    assert data.ensure_cache(verbose=False) == path
    assert len(token_cache.open_split(path, "eval").tokens) == meta["eval"]["tokens"]
    with pytest.raises(ConfigError, match=r"records no digests .*delete it to rebuild"):
        token_cache.verify(path, digests=True)
    with open(os.path.join(path, "eval.offsets.npy"), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(path, "eval.offsets.npy")) - 8)
    with pytest.raises(ConfigError, match=r"eval.offsets.npy is \d+ bytes, \d+ when it was built"):
        data.ensure_cache(verbose=False)


def test_prepare_data_verify(built, tmp_path):
    """experiments.prepare_data --verify: the digests of an existing cache checked; a damaged one is one error line
    (exit 2) naming the file."""
    cfg, _, path = built
    command = [sys.executable, "-m", "experiments.prepare_data", "--config=configs/lm.py:gpt2_tiny",
               f"--config.data.files={cfg.files}", f"--config.data.cache_dir={cfg.cache_dir}",
               f"--config.data.eval_fraction={cfg.eval_fraction}", "--verify"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["cache"] == path and len(result["verified"]) == 4
    with open(os.path.join(path, "train.tokens"), "r+b") as f:
        f.write(b"\x07\x07")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"error: the token cache {path} is damaged: train.tokens does not hold the bytes" in done.stderr


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_next_build_removes_the_temporary_directories_of_dead_builds(tmp_path):
    """A killed build left its temporary directory (19 MB seen) forever. The next build of that cache (it holds
    the claim) removes it, and those of other caches whose claim is dead; a live build's is kept."""
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(40))
    cfg = data_config(tmp_path, folder)
    tok = tokenizers.ByteTokenizer()
    path = token_cache.cache_path(cfg, tok)
    root = os.path.dirname(path)
    os.makedirs(root)
    killed = os.path.join(root, f".{os.path.basename(path)}.tmp-killed1")  # this cache's, its claim left by a dead pid
    other_dead = os.path.join(root, f".{'a' * 24}.tmp-killed2")  # another cache's, no claim at all
    other_live = os.path.join(root, f".{'b' * 24}.tmp-building")  # another cache's, a live claim
    for d in (killed, other_dead, other_live):
        os.makedirs(d)
        with open(os.path.join(d, "train.tokens"), "wb") as f:
            f.write(b"\0" * 1000)
    with open(path + ".building", "w") as f:
        json.dump({"host": os.uname().nodename, "pid": _dead_pid(), "token": "x"}, f)
    live = file_claims.try_claim(os.path.join(root, "b" * 24 + ".building"), 300.0, 30.0)
    try:
        assert token_cache.ensure_cache(cfg, tok, verbose=False) == path
    finally:
        live.release()
    assert not os.path.exists(killed) and not os.path.exists(other_dead) and os.path.isdir(other_live)
    assert not [n for n in os.listdir(root) if n.endswith(".building")]


@pytest.mark.slow
def test_a_killed_build_leaves_nothing_after_the_next_build(tmp_path):
    """The kill for real: a build process killed just before its rename leaves its temporary directory and claim;
    the next ensure_cache takes the claim over, builds, and removes the directory."""
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(40))
    cfg = data_config(tmp_path, folder)
    script = ("import os, ml_collections\n"
              "from transformer.data import token_cache, tokenizers\n"
              "os.rename = lambda *a: os._exit(9)\n"
              f"token_cache.ensure_cache(ml_collections.ConfigDict({cfg.to_dict()!r}), tokenizers.ByteTokenizer(), "
              f"verbose=False)\n")
    assert subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True).returncode == 9
    path = token_cache.cache_path(cfg, tokenizers.ByteTokenizer())
    root = os.path.dirname(path)
    assert [n for n in os.listdir(root) if ".tmp-" in n] and os.path.exists(path + ".building")
    assert token_cache.ensure_cache(cfg, tokenizers.ByteTokenizer(), verbose=False) == path
    assert sorted(os.listdir(root)) == [os.path.basename(path)]
    assert np.asarray(token_cache.open_split(path, "train").tokens).size > 0


def test_a_killed_sentencepiece_training_leaves_no_temporary_file(tmp_path):
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(60))
    cfg = data_config(tmp_path, folder, tokenizer="sentencepiece", vocab_size=300)
    path = tokenizers.sentencepiece_path(cfg)
    os.makedirs(os.path.dirname(path))
    with open(f"{path}.tmp-{_dead_pid()}", "wb") as f:  # what a trainer killed before its rename leaves
        f.write(b"half a model")
    tokenizers.get_tokenizer(cfg)
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]
