""""Same data", once (issue 29, section 4 and 3.3): the data identity is content-addressed (each file's path relative
to the files' common folder and its content digest, the split rule, the text field; never an mtime), and the token
cache key, the SentencePiece model path and the change check all derive from it. A touched corpus changes nothing
(above 1,000 files too); a copy of the corpus in another folder reuses its cache; records written by the older
format (mtimes and absolute paths in the source) still resume when the data is unchanged."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time

import pytest
from test_data_files import _texts, data_config, write_mixed_folder

from configs.lm import get_config
from transformer.data import documents, identity, token_cache, tokenizers
from transformer.spec import ConfigError


def _touch_all(folder: str) -> None:
    """Every file's mtime moved forward by an hour; contents unchanged."""
    later = time.time() + 3600
    for name in os.listdir(folder):
        os.utime(os.path.join(folder, name), (later, later))


def _meta_mtime(path: str) -> int:
    return os.stat(os.path.join(path, "meta.json")).st_mtime_ns


def _write_small_files(folder: str, n: int) -> None:
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        with open(os.path.join(folder, f"f{i:05d}.txt"), "w") as f:
            f.write(f"document {i} of a corpus of many small files.")


def _old_identity(cfg, tokenizer_fingerprint: str, listed: bool) -> dict:
    """data.identity as the version before issue 29 recorded it: a source fingerprint of each file's absolute path,
    size, mtime and content digest and the split rule (that version's documents.files_fingerprint, verbatim), and
    [setting, absolute path, digest] rows (none above 1,000 files)."""
    split = documents.split_files(cfg)
    h, rows = hashlib.sha256(), []
    for name, (setting, paths) in sorted(split.items()):
        h.update(f"{name}|{setting}\n".encode())
        for path in paths:
            st = os.stat(path)
            digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
            h.update(f"{path}|{st.st_size}|{st.st_mtime_ns}|{digest}\n".encode())
            rows.append([setting, path, digest])
    held_out = not str(cfg.get("eval_files", "") or "").strip()
    h.update(f"text_feature={cfg.text_feature}|held_out={held_out}|"
             f"fraction={float(cfg.get('eval_fraction', 0.0)) if held_out else 0}".encode())
    source = h.hexdigest()[:20]
    return {"source": source, "tokenizer": tokenizer_fingerprint,
            "cache_key": token_cache.cache_key(source, tokenizer_fingerprint),
            "files": sorted({tuple(r) for r in rows}) if listed else []}


def test_touching_every_file_changes_no_key_and_rebuilds_nothing(tmp_path):
    """3.3: the old fingerprint hashed mtimes, so one `touch` made a new token cache (re-tokenizing everything) and
    a new SentencePiece path (retraining it), while the recorded identity compared content."""
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(80))
    cfg = data_config(tmp_path, folder, tokenizer="sentencepiece", vocab_size=300)
    before = identity.resolve_data(cfg)  # trains the SentencePiece model
    model_path = tokenizers.sentencepiece_path(cfg)
    cache = before.ensure_cache(verbose=False)
    built, model_mtime = _meta_mtime(cache), os.stat(model_path).st_mtime_ns
    _touch_all(folder)
    after = identity.resolve_data(cfg)
    assert tokenizers.sentencepiece_path(cfg) == model_path and os.stat(model_path).st_mtime_ns == model_mtime
    assert after.tokenizer.fingerprint == before.tokenizer.fingerprint  # the model read, not retrained
    assert after.identity() == before.identity() and after.cache_key == before.cache_key
    assert after.ensure_cache(verbose=False) == cache and _meta_mtime(cache) == built  # not rebuilt
    assert identity.describe_change(before.identity(), after.identity()) is None


def test_a_touched_corpus_above_the_listed_files_is_the_same_data(tmp_path):
    """3.3: above MAX_LISTED_FILES the identity holds no file list; its source (then one digest of all the files)
    included the mtimes, so a touched corpus was refused on resume, and accepted below the limit."""
    folder = str(tmp_path / "many")
    _write_small_files(folder, identity.MAX_LISTED_FILES + 5)
    cfg = data_config(tmp_path, folder, eval_fraction=0.2)
    before = identity.resolve_data(cfg, tokenizers.ByteTokenizer())
    assert before.identity()["files"] == []  # one digest of them all: the source
    cache = before.ensure_cache(verbose=False)
    built = _meta_mtime(cache)
    sp_path = tokenizers.sentencepiece_path(data_config(tmp_path, folder, eval_fraction=0.2, tokenizer="sentencepiece"))
    _touch_all(folder)
    after = identity.resolve_data(cfg, tokenizers.ByteTokenizer())
    assert identity.describe_change(before.identity(), after.identity()) is None
    identity.check_same("workdir w", before.identity(), after.identity())
    assert after.ensure_cache(verbose=False) == cache and _meta_mtime(cache) == built
    assert tokenizers.sentencepiece_path(data_config(tmp_path, folder, eval_fraction=0.2,
                                                     tokenizer="sentencepiece")) == sp_path
    with open(os.path.join(folder, "f00003.txt"), "a") as f:  # content still counts
        f.write(" changed")
    changed = identity.resolve_data(cfg, tokenizers.ByteTokenizer()).identity()
    with pytest.raises(ConfigError, match=r"workdir w was trained on other data.*the documents changed"):
        identity.check_same("workdir w", before.identity(), changed)


def test_a_copy_of_the_corpus_in_another_folder_reuses_its_cache(tmp_path):
    """A node-local copy (same relative paths and content) has the same identity: the same cache, not rebuilt, and
    no change; a changed file of the copy is named."""
    folder, copy = str(tmp_path / "shared" / "docs"), str(tmp_path / "local" / "docs")
    write_mixed_folder(folder, _texts(60))
    shutil.copytree(folder, copy)  # copies get new mtimes
    original = identity.resolve_data(data_config(tmp_path, folder), tokenizers.ByteTokenizer())
    cache = original.ensure_cache(verbose=False)
    built = _meta_mtime(cache)
    local = identity.resolve_data(data_config(tmp_path, copy), tokenizers.ByteTokenizer())
    assert local.source == original.source and local.ensure_cache(verbose=False) == cache
    assert _meta_mtime(cache) == built
    assert identity.describe_change(original.identity(), local.identity()) is None
    changed = os.path.join(copy, "d001.txt")
    with open(changed, "a") as f:
        f.write(" and more")
    moved = identity.resolve_data(data_config(tmp_path, copy), tokenizers.ByteTokenizer())
    assert moved.cache_key != original.cache_key
    assert identity.describe_change(original.identity(), moved.identity()) == f"data.files: changed {changed}"


def test_the_split_rule_is_part_of_the_identity(tmp_path):
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(40))
    a = identity.resolve_data(data_config(tmp_path, folder, eval_fraction=0.25), tokenizers.ByteTokenizer())
    b = identity.resolve_data(data_config(tmp_path, folder, eval_fraction=0.5), tokenizers.ByteTokenizer())
    assert a.cache_key != b.cache_key
    assert "the split rule or the text field changed" in identity.describe_change(a.identity(), b.identity())


def test_old_format_identity_records_keep_resuming_on_unchanged_data(tmp_path):
    """Backward compatibility: a config.json or sweep.json written before the content-addressed identity. With its
    files listed it compares by content (relative path and digest); without (above 1,000 files) its mtime-bearing
    source is recomputed from the files now: unchanged files resume, a touched or changed corpus is refused with a
    message saying the old record cannot compare content (never accepted unseen)."""
    from transformer.training.resolve import resolve
    from transformer.training.run_io import check_workdir_config

    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, _texts(60))
    config = get_config("gpt2_tiny")
    config.data = data_config(tmp_path, folder)
    config.train.update(steps=2, warmup_steps=1, batch_size=8)
    new = resolve(config, 1, 1)
    old = _old_identity(config.data, "bytes", listed=True)
    assert old["source"] != new.data.source  # another format: only the listed files can compare
    workdir = str(tmp_path / "run")
    os.makedirs(workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump({**new.config, "data": {**new.config["data"], "identity": old}}, f)
    assert check_workdir_config(workdir, json.loads(json.dumps(resolve(config, 1, 1).config))) is None
    swept = config.copy_and_resolve_references()
    swept.data.identity = old  # a sweep's runs carry sweep.json's data_identity
    resolve(swept, 1, 1)
    changed = os.path.join(folder, "d000.txt")
    with open(changed, "a") as f:
        f.write(" changed")
    with pytest.raises(ConfigError, match=rf"data.files: changed {changed}"):
        check_workdir_config(workdir, json.loads(json.dumps(resolve(config, 1, 1).config)))

    many = str(tmp_path / "many")
    _write_small_files(many, identity.MAX_LISTED_FILES + 1)
    cfg = data_config(tmp_path, many, eval_fraction=0.2)
    old = _old_identity(cfg, "bytes", listed=False)
    now = identity.resolve_data(cfg, tokenizers.ByteTokenizer()).identity()
    assert identity.describe_change(old, now) is None  # unchanged, untouched: resumes
    _touch_all(many)
    now = identity.resolve_data(cfg, tokenizers.ByteTokenizer()).identity()
    with pytest.raises(ConfigError, match=r"older format .*the content cannot be compared"):
        identity.check_same("workdir w", old, now)
