"""Named evaluation sets (data.eval_sets, issue 32 §1): each set tokenized once into its own token cache, evaluated
at every evaluation by the loop's one registry of evaluators (training/evaluators.py), reported per name in
metrics.jsonl, TensorBoard and summary.json; a set that holds training data is refused like data.eval_files."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from test_data_files import _texts, data_config
from test_tensorboard import _tensorboard_scalars

from configs.lm import get_config
from transformer.data import eval_sets, token_cache
from transformer.spec import ConfigError, DataSpec
from transformer.spec.data import HELDOUT, eval_set_entries
from transformer.training import evaluators, loop
from transformer.training.metrics import read_metrics
from transformer.training.resolve import resolve
from transformer.training.run_io import absent_as_default


def _write_jsonl(path: str, texts: list[str]) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return path


def _files_config(tmp_path, **data):
    """gpt2_tiny on local files: 60 training documents, 12 explicit eval documents (data.eval_files)."""
    train = _write_jsonl(str(tmp_path / "train" / "docs.jsonl"), _texts(60))
    held = _write_jsonl(str(tmp_path / "held" / "eval.jsonl"), _texts(12, seed=5))
    config = get_config("gpt2_tiny")
    config.data = data_config(tmp_path, os.path.dirname(train), eval_files=held, **data)
    config.train.update(steps=4, batch_size=8, warmup_steps=1, log_every=2, eval_every=2, eval_steps=2,
                        checkpoint_every=4)
    return config, held


def test_the_entries_are_parsed_and_checked():
    assert eval_set_entries("") == () and eval_set_entries({}) == ()
    assert eval_set_entries("wiki=~/w/*.jsonl,~/x.txt; own=heldout") == (
        ("wiki", ("~/w/*.jsonl", "~/x.txt")), ("own", HELDOUT))
    assert eval_set_entries({"a": ["x.txt"], "b": "heldout"}) == (("a", ("x.txt",)), ("b", HELDOUT))
    for bad, says in (("wiki", "is not NAME=FILES"), ("a b=x.txt", "letters, digits"), ("a=x.txt;a=y.txt", "twice"),
                      ("a=", "names no file"), (3, "must be a mapping")):
        with pytest.raises(ConfigError, match=says):
            DataSpec.of({"eval_sets": bad})


def test_a_set_is_refused_for_a_task_without_next_token_targets():
    config = get_config("gpt2_tiny")
    config.model.family, config.train.task = "encoder", "mlm"
    config.data.eval_sets = "own=heldout"
    with pytest.raises(ConfigError, match="data.eval_sets needs a next-token model"):
        resolve(config, 1, 1)


def test_a_run_without_eval_sets_recorded_resumes_under_the_key():
    recorded = {"data": {"files": ""}, "train": {}, "model": {}}
    assert absent_as_default(recorded, {"data": {"files": "", "eval_sets": ""}, "train": {}, "model": {}})[
        "data"]["eval_sets"] == ""


@pytest.mark.slow  # CI's 15 minutes: 14 s of the default run on 2 loaded cores (2026-11-27)
def test_sets_are_evaluated_at_every_evaluation_and_reported_per_name(tmp_path, monkeypatch):
    """A set that is a copy of the run's eval files (another path, the same documents) reports exactly the run's
    eval_loss and eval_bits_per_byte: the same tokens, rows and batches through the set's own cache; `heldout` is
    the run's own split. Each set is tokenized once, its iterator made once per run."""
    config, held = _files_config(tmp_path)
    copy = str(tmp_path / "copy" / "same.jsonl")
    os.makedirs(os.path.dirname(copy))
    shutil.copy(held, copy)
    other = _write_jsonl(str(tmp_path / "other" / "o.jsonl"), _texts(9, seed=7))
    config.data.eval_sets = f"copy={copy};other={other};own=heldout"
    builds, made = [], []
    real_build, real_build_cache = token_cache._build, evaluators.Evaluator._batches
    monkeypatch.setattr(token_cache, "_build", lambda *a, **k: builds.append(a[2]) or real_build(*a, **k))

    def counted(self):
        if self._it is None:
            made.append(self.keys)
        return real_build_cache(self)

    monkeypatch.setattr(evaluators.Evaluator, "_batches", counted)
    workdir = str(tmp_path / "run")
    summary = loop.train(config, workdir, verbose=False)
    assert summary["status"] == "ok"
    assert len(builds) == 3 and len(made) == 4  # the run's cache and two sets' caches; 4 iterators for 2 evaluations
    sets = summary["eval_sets"]
    assert list(sets) == ["copy", "other", "own"] and summary["tasks"] == {}
    for name in ("copy", "own"):
        assert sets[name] == {"loss": summary["eval_loss"], "bits_per_byte": summary["eval_bits_per_byte"]}, name
    assert sets["other"]["loss"] != summary["eval_loss"] and sets["other"]["bits_per_byte"] > 0
    rows = [r for r in read_metrics(workdir) if "eval_loss" in r]
    assert [r["step"] for r in rows] == [2, 4]
    assert all(f"eval/{n}/{m}" in r for r in rows for n in sets for m in ("loss", "bits_per_byte"))
    assert rows[-1]["eval/other/loss"] == sets["other"]["loss"]
    scalars = next(iter(_tensorboard_scalars(workdir).values()))
    assert [s for s, _ in scalars["eval/other/bits_per_byte"]] == [2, 4]

    builds.clear()
    data = resolve(config, 8, 1).data
    again = eval_sets.open_sets(data, data.ensure_cache(False), verbose=False)  # the caches are reused
    assert [s.name for s in again] == ["copy", "other", "own"] and builds == []


def test_a_set_holding_a_training_file_is_refused_before_anything_is_written(tmp_path):
    config, _ = _files_config(tmp_path)
    copy = str(tmp_path / "leak" / "copy.jsonl")
    os.makedirs(os.path.dirname(copy))
    shutil.copy(str(tmp_path / "train" / "docs.jsonl"), copy)
    config.data.eval_sets = f"leak={copy}"
    workdir = str(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"data.eval_sets.leak: 1 file\(s\) are files of data.files .*copy.jsonl"):
        loop.train(config, workdir, verbose=False)
    assert not os.path.exists(workdir)


def test_a_set_holding_a_training_document_is_refused_before_the_run_writes(tmp_path):
    config, _ = _files_config(tmp_path)
    mixed = _write_jsonl(str(tmp_path / "mixed" / "m.jsonl"), _texts(4, seed=8) + _texts(60)[3:5])
    config.data.eval_sets = f"mixed={mixed}"
    workdir = str(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"data.eval_sets.mixed: 2 of its 6 documents are also documents of the "
                                          r"training data"):
        loop.train(config, workdir, verbose=False)
    assert not os.path.exists(workdir)


def test_the_registry_runs_every_evaluation_and_refuses_a_key_reported_twice():
    registry = evaluators.Evaluators()
    registry.add("a", lambda params: {"x": params})
    registry.add("b", lambda params: {"y": 2 * params})
    assert registry(3) == {"x": 3, "y": 6} and registry.names == ["a", "b"]
    with pytest.raises(ValueError, match="registered already"):
        registry.add("a", lambda params: {})
    registry.add("c", lambda params: {"x": 0})
    with pytest.raises(ValueError, match="reports \\['x'\\]"):
        registry(1)
