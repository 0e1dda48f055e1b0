"""The data.* plain values and the glob lists (issue 29, 2.5 and 2.6): a bad value is one ConfigError naming the
setting (data.shuffle_seed=-1 was a traceback from numpy's SeedSequence); a file whose name holds a comma can be
named in data.files (`\\,`, or a list of globs)."""
from __future__ import annotations

import os
import subprocess
import sys

import ml_collections
import pytest

from configs.common import base_config
from transformer.data import documents, identity, tokenizers
from transformer.spec import ConfigError, DataSpec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("changes, message", [
    (dict(shuffle_seed=-1), r"data\.shuffle_seed=-1 must be >= 0, an integer"),
    (dict(shuffle_seed=1.5), r"data\.shuffle_seed=1\.5 must be >= 0, an integer"),
    (dict(shuffle_seed=True), r"data\.shuffle_seed=True must be >= 0, an integer"),
    (dict(vocab_size=0), r"data\.vocab_size=0 must be a positive integer"),
    (dict(vocab_size="1024"), r"data\.vocab_size='1024' must be a positive integer"),
    (dict(seq_len=16.0), r"data\.seq_len=16\.0 must be a positive integer"),
    (dict(eval_fraction="0.1"), r"data\.eval_fraction='0\.1' must be a number in \(0, 1\)"),
    (dict(files="/x/*.txt", eval_fraction=1.0), r"data\.eval_fraction=1\.0 must be in \(0, 1\) when data\.eval_files"),
    (dict(tokenizer=None), r"data\.tokenizer=None must be a string"),
    (dict(cache_dir=3), r"data\.cache_dir=3 must be a string"),
    (dict(text_feature=" "), r"data\.text_feature is empty"),
    (dict(files=5), r"data\.files=5 must be a string of comma-separated globs or a list of globs"),
    (dict(files="/x/*.txt", eval_files=["/y/*.txt", 3]), r"data\.eval_files=\['/y/\*\.txt', 3\] must be a string"),
])
def test_a_bad_plain_data_value_is_one_error_naming_it(changes, message):
    """As a sweep.json or a dict config can hold them (a ConfigDict's types catch some of these earlier)."""
    with pytest.raises(ConfigError, match=message):
        DataSpec.of({**base_config().data.to_dict(), **changes})


def _python(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TRANSFORMER_HUGE_PAGES": "0"}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_a_negative_shuffle_seed_is_one_error_line_before_anything_runs(tmp_path):
    """The real run died in SeedSequence with a traceback; the dry run accepted it. Both now stop at the spec."""
    done = _python(["-m", "experiments.train", "--config=configs/lm.py:gpt2_tiny", "--dry_run",
                    f"--workdir={tmp_path / 'run'}", "--config.data.shuffle_seed=-1"])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert [ln for ln in done.stderr.splitlines() if ln.startswith("error:")] == [
        "error: data.shuffle_seed=-1 must be >= 0, an integer"]
    assert not os.path.exists(tmp_path / "run")


@pytest.fixture
def comma_folder(tmp_path) -> str:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a,b.txt").write_text("a document whose file name holds a comma")
    (folder / "c.txt").write_text("another document, in an ordinary file")
    (folder / "d.txt").write_text("a third document")
    return str(folder)


def test_a_file_name_with_a_comma_can_be_named(comma_folder, tmp_path):
    """`\\,` stands for a comma inside a glob; a list of globs takes each whole. (Splitting on every comma made
    `a,b.txt` the globs `a` and `b.txt`.)"""
    named = os.path.join(comma_folder, "a,b.txt")
    escaped = os.path.join(comma_folder, "a\\,b.txt") + "," + os.path.join(comma_folder, "c.txt")
    assert documents.expand("data.files", escaped) == [named, os.path.join(comma_folder, "c.txt")]
    assert documents.expand("data.files", [named]) == [named]
    base = dict(base_config().data.to_dict(), eval_fraction=0.5, cache_dir=str(tmp_path / "cache"))
    as_list = identity.resolve_data({**base, "files": [named, os.path.join(comma_folder, "c.txt")]},
                                    tokenizers.ByteTokenizer())
    as_string = identity.resolve_data({**base, "files": escaped}, tokenizers.ByteTokenizer())
    assert as_list.identity() == as_string.identity()  # the same files, so the same data
    assert sorted(p for _, p, _ in as_list.identity()["files"]) == [named, os.path.join(comma_folder, "c.txt")]
    data = identity.resolve_data({**base, "files": [named], "eval_files": [os.path.join(comma_folder, "d.txt")]},
                                 tokenizers.ByteTokenizer())
    assert data.config.has_eval_files and not data.config.holds_out


def test_relative_globs_with_commas_are_made_absolute_whole(comma_folder, monkeypatch):
    from experiments._paths import absolute_config

    monkeypatch.chdir(os.path.dirname(comma_folder))
    config = ml_collections.ConfigDict({"data": {"files": "docs/a\\,b.txt, docs/c.txt", "eval_files": ""}})
    assert absolute_config(config).data.files == f"{comma_folder}/a\\,b.txt,{comma_folder}/c.txt"
    config = ml_collections.ConfigDict({"data": {"files": ["docs/a,b.txt", "~/x.txt"], "eval_files": ""}})
    assert absolute_config(config).data.files == [f"{comma_folder}/a,b.txt", "~/x.txt"]


def test_the_command_line_names_a_file_with_a_comma(comma_folder, tmp_path):
    done = _python(["-m", "experiments.prepare_data", "--config=configs/lm.py:gpt2_tiny",
                    f"--config.data.files={comma_folder}/a\\,b.txt,{comma_folder}/c.txt",
                    f"--config.data.eval_files={comma_folder}/d.txt", f"--config.data.cache_dir={tmp_path / 'cache'}"])
    assert done.returncode == 0, done.stderr
    assert '"train": {"documents": 2' in done.stdout  # a,b.txt and c.txt
