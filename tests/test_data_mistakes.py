"""A user's data mistakes (issue 20 §2), each its own test: one error naming the setting and the file, before
anything runs, with no workdir and no lock file left behind."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from configs.common import base_config
from test_data_files import train_hf_tokenizer
from transformer.data import documents, identity
from transformer.spec import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD = [f"document {i}: " + "some ordinary words here. " * 20 for i in range(12)]


def _folder(tmp_path, extra: dict[str, bytes] | None = None) -> str:
    """tmp/data/ with 12 good .txt documents plus `extra` files {name: content}."""
    d = tmp_path / "data"
    d.mkdir(exist_ok=True)
    for i, text in enumerate(GOOD):
        (d / f"good{i:02d}.txt").write_text(text)
    for name, content in (extra or {}).items():
        (d / name).write_bytes(content)
    return str(d)


def _data(tmp_path, files: str, **overrides):
    cfg = base_config().data
    cfg.update(dict(files=files, eval_fraction=0.25, cache_dir=str(tmp_path / "cache"), seq_len=16))
    cfg.update(overrides)
    return cfg


def _build(cfg) -> str:
    """What a first run (or experiments.prepare_data) does with the data: resolve, then tokenize into the cache."""
    return identity.resolve_data(cfg).ensure_cache(verbose=False)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu", "TRANSFORMER_HUGE_PAGES": "0"}


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "error:" in ln]


def test_a_binary_file_named_txt_is_one_error_naming_it(tmp_path):
    """NUL bytes: not text. (The old code decoded it with replacement characters and trained on it.)"""
    folder = _folder(tmp_path, {"image.txt": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4})
    with pytest.raises(ConfigError, match=re.escape(os.path.join(folder, "image.txt")) + " is not text") as e:
        _build(_data(tmp_path, os.path.join(folder, "*.txt")))
    assert str(e.value).startswith("data.files: ")


def test_a_file_mostly_not_utf8_is_one_error_and_a_few_bad_bytes_are_not(tmp_path):
    """Mostly invalid UTF-8 (no NUL byte): an error naming the file; a text with a few Latin-1 bytes is read
    (each invalid byte becomes U+FFFD, as before)."""
    noise = bytes(b for b in range(128, 256)) * 20  # every byte invalid as UTF-8, none NUL
    folder = _folder(tmp_path, {"noise.txt": noise})
    with pytest.raises(ConfigError, match=r"noise.txt is not UTF-8 text \(2560 of its 2560 bytes"):
        _build(_data(tmp_path, os.path.join(folder, "*.txt")))
    latin1 = "Caf\u00e9 cr\u00e8me, d\u00e9j\u00e0 vu. ".encode("latin-1") * 20  # 4 bad bytes in 21
    text = next(documents.read_file(_write(tmp_path / "latin1.txt", latin1), "text", "data.files"))
    assert text.count("\ufffd") == 80


def _write(path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


def test_a_jsonl_line_with_nul_bytes_names_the_file_and_line(tmp_path):
    good = json.dumps({"text": "fine"}).encode() + b"\n"
    path = _write(tmp_path / "x.jsonl", good * 2 + b'{"text": "a\x00b"}\n')
    with pytest.raises(ConfigError, match=r"x.jsonl line 3 is not text"):
        list(documents.read_file(path, "text", "data.files"))


def test_a_malformed_jsonl_line_gives_file_line_and_column_in_full(tmp_path):
    """The old message ended "(Invalid control character at)": the position was cut off."""
    good = json.dumps({"text": "fine"}) + "\n"
    path = _write(tmp_path / "x.jsonl", (good * 2 + '{"text": "a\tb"}\n').encode())
    with pytest.raises(ConfigError) as e:
        list(documents.read_file(path, "text", "data.files"))
    assert str(e.value).startswith(f"data.files: {path} line 3 is not JSON: Invalid control character at column 12")
    with pytest.raises(json.JSONDecodeError, match="line 1 column 12"):
        json.loads('{"text": "a\tb"}')


def test_a_jsonl_gz_that_is_not_gzip_is_one_error(tmp_path):
    path = _write(tmp_path / "x.jsonl.gz", json.dumps({"text": "plain, not compressed"}).encode() + b"\n")
    with pytest.raises(ConfigError, match=r"x.jsonl.gz is not a readable gzip file"):
        list(documents.read_file(path, "text", "data.files"))


def test_an_unreadable_file_is_one_error_naming_it(tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    locked = os.path.join(folder, "good03.txt")
    real_open = open

    def no_read(path, *args, **kwargs):  # as chmod 000 would, for any user (tests may run as root)
        if str(path) == locked:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(documents, "open", no_read, raising=False)
    with pytest.raises(ConfigError, match=re.escape(f"data.files: cannot read {locked} (Permission denied)")):
        identity.check_data(_data(tmp_path, os.path.join(folder, "*.txt")))


def test_data_files_beside_a_tfds_name_is_one_error(tmp_path):
    """The old code trained on the files and ignored data.tfds_name without a word."""
    cfg = _data(tmp_path, os.path.join(_folder(tmp_path), "*.txt"), tfds_name="wikitext/wikitext-103-raw-v1")
    with pytest.raises(ConfigError, match="data.files=.* and data.tfds_name='wikitext/wikitext-103-raw-v1' both "
                                          "name the documents"):
        identity.check_settings(cfg)
    with pytest.raises(ConfigError, match="both name the documents"):
        _build(cfg)
    for name in ("stdlib_py", ""):  # the default, or cleared: the files are the one source
        identity.check_settings(_data(tmp_path, cfg.files, tfds_name=name))


def test_a_data_error_leaves_no_workdir_and_no_lock_file(tmp_path):
    """The README's promise, "without touching the workdir": the old code created an empty workdir and left
    tokens/<key>.lock in the cache."""
    from configs.lm import get_config
    from transformer.training.loop import train

    folder = _folder(tmp_path, {"image.txt": b"\x00\x01\x02" * 100})
    config = get_config("gpt2_tiny")
    config.data.update({"files": os.path.join(folder, "*.txt"), "cache_dir": str(tmp_path / "cache"),
                        "eval_fraction": 0.25, "seq_len": 16})
    config.train.update(steps=2, warmup_steps=1, batch_size=8)
    with pytest.raises(ConfigError, match="image.txt is not text"):
        train(config, str(tmp_path / "run"), verbose=False)
    assert not (tmp_path / "run").exists()
    left = [os.path.join(r, n) for r, _, names in os.walk(tmp_path / "cache") for n in names]
    assert left == []  # no lock file, no half-built cache


def test_a_sentencepiece_training_on_bad_data_leaves_no_lock_file(tmp_path):
    from transformer.data import tokenizers

    folder = _folder(tmp_path, {"image.txt": b"\x00\x01\x02" * 100})
    cfg = _data(tmp_path, os.path.join(folder, "*.txt"), tokenizer="sentencepiece", vocab_size=64)
    with pytest.raises(ConfigError, match="image.txt is not text"):
        tokenizers.get_tokenizer(cfg)
    assert [n for r, _, names in os.walk(tmp_path / "cache") for n in names] == []


def test_an_error_while_the_tokenizing_bar_is_open_starts_on_its_own_line(tmp_path):
    """experiments.prepare_data shows a progress bar while it tokenizes; an error found meanwhile was glued to
    the bar's line ("tokenizing train: 0.00tok [00:00, ?tok/s]error: ...")."""
    folder = _folder(tmp_path, {"zz.jsonl": json.dumps({"text": "fine"}).encode() + b"\n{broken\n"})
    proc = subprocess.run([sys.executable, "-m", "experiments.prepare_data", "--config=configs/lm.py:gpt2_tiny",
                           f"--config.data.files={folder}/*", f"--config.data.cache_dir={tmp_path / 'cache'}",
                           "--config.data.eval_fraction=0.25"], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "tokenizing train" in proc.stderr  # the bar was open
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and errors[0].startswith("error: data.files: ")
    assert "zz.jsonl line 2 is not JSON" in errors[0]
    assert not os.path.exists(tmp_path / "cache" / "tokens") or os.listdir(tmp_path / "cache" / "tokens") == []


def test_train_dry_run_checks_the_data_and_exits_2(tmp_path):
    """--dry_run reads no document, but checks what a real run checks first: the globs match, the files are
    readable, the tokenizer loads; each mistake is one error line and exit status 2, and nothing is written."""
    folder = _folder(tmp_path)
    (tmp_path / "tok.json").write_text('{"not": "a tokenizer"}')
    base = [sys.executable, "-m", "experiments.train", "--config=configs/lm.py:gpt2_tiny", "--dry_run",
            f"--config.data.cache_dir={tmp_path / 'cache'}", f"--workdir={tmp_path / 'run'}"]
    cases = {"matches no file": [f"--config.data.files={folder}/*.jsonl"],
             "is not a Hugging Face tokenizer.json": [f"--config.data.files={folder}/*.txt",
                                                      f"--config.data.tokenizer={tmp_path / 'tok.json'}"],
             "both name the documents": [f"--config.data.files={folder}/*.txt", "--config.data.tfds_name=imdb"]}
    for message, args in cases.items():
        proc = subprocess.run(base + args, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and message in proc.stderr, (message, proc.stderr[-2000:])
        assert len(_error_lines(proc.stderr)) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_a_sweep_checks_its_data_once_before_designing_anything(tmp_path):
    """A sweep's base.data is checked before the plan: one error, exit 2, no sweep.json, no run launched, its
    dry run likewise. (The old sweep designed first; its dry run showed the plan of a sweep that would train on
    the files and ignore data.tfds_name.)"""
    folder = _folder(tmp_path)
    tok = str(tmp_path / "tokenizer.json")
    train_hf_tokenizer(tok, GOOD)
    workdir = tmp_path / "sweep"
    cases = [([f"--config.base.data.files={folder}/*.jsonl"],
              f"data.files: the glob '{folder}/*.jsonl' matches no file"),
             ([f"--config.base.data.files={folder}/*.txt", "--config.base.data.tfds_name=imdb", "--dry_run"],
              "both name the documents")]
    for args, message in cases:
        proc = subprocess.run([sys.executable, "-m", "experiments.sweep", "--config=configs/sweeps/quick.py",
                               f"--workdir={workdir}", f"--config.base.data.tokenizer={tok}", *args],
                              cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        errors = _error_lines(proc.stderr)
        assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
        assert proc.stdout == "" and not workdir.exists()  # no plan printed, nothing written


def test_prepare_data_checks_the_data_as_a_run_does(tmp_path):
    """experiments.prepare_data takes the run's route (identity.resolve_data): data.files beside a TFDS name
    is refused there too, before any tokenizing."""
    folder = _folder(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "experiments.prepare_data", "--config=configs/lm.py:gpt2_tiny",
                           f"--config.data.files={folder}/*.txt", "--config.data.tfds_name=imdb",
                           f"--config.data.cache_dir={tmp_path / 'cache'}"], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(_error_lines(proc.stderr)) == 1 and "both name the documents" in proc.stderr
    assert "tokenizing" not in proc.stderr and not (tmp_path / "cache").exists()
